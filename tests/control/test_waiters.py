"""Parked requests waiting for many keys: each is answered once all its keys are set, and waking
them costs lookups in proportion to the keys, not to keys times sets (a rendezvous of N ranks,
each reading all N addresses, must not cost N^3)."""

from __future__ import annotations

import threading
from typing import Any

import msgpack

from torchcomms.control.client import ControlClient
from torchcomms.control.kvstore import KeyValueStore
from torchcomms.control.protocol import Limits, Request
from torchcomms.control.server import StoreServer


class _Replies:
    def __init__(self) -> None:
        self.ok_replies: dict[int, Any] = {}

    def ok(self, identity: bytes, request_id: int, value: Any = None) -> None:
        self.ok_replies[request_id] = value

    def ok_packed(self, identity: bytes, request_id: int, packed_value: bytes) -> None:
        self.ok_replies[request_id] = msgpack.unpackb(packed_value, raw=False)

    def error(self, identity: bytes, request_id: int | None, code: str, message: str,
              keys: list[str] | None = None) -> None:
        raise AssertionError(f"unexpected error reply {code}: {message}")


class _CountingDict(dict):  # type: ignore[type-arg]
    lookups = 0

    def __contains__(self, key: object) -> bool:
        _CountingDict.lookups += 1
        return super().__contains__(key)


def test_rendezvous_wakeups_cost_lookups_per_key_not_per_key_set() -> None:
    n = 200
    replies = _Replies()
    store = KeyValueStore(Limits(), replies, max_pending=10_000)
    store.data = _CountingDict()
    keys = [f"addr/{r}" for r in range(n)]
    for r in range(n):  # every rank reads everyone's address before anyone wrote one
        store.op_multi_get(b"rank%d" % r, Request(r, "multi_get", {"keys": keys, "timeout": 60.0}))
    _CountingDict.lookups = 0
    for r in range(n):
        store.op_set(b"rank%d" % r, Request(n + r, "set", {"key": keys[r], "value": b"%d" % r}))
    assert all(replies.ok_replies[r] == [b"%d" % i for i in range(n)] for r in range(n))
    # each waiter looks its n keys up once when the last one is set (n * n), not after every
    # set (n * n * n / 2 = 4,000,000 here)
    assert _CountingDict.lookups <= 2 * n * n
    assert store.pending == 0


def test_duplicate_keys_and_a_key_deleted_while_waiting(secret: bytes) -> None:
    with StoreServer("127.0.0.1", 0, secret) as srv, \
            ControlClient(srv.address, secret, timeout=20.0) as client:
        got: dict[str, Any] = {}

        def read() -> None:
            got["values"] = client.multi_get(["a", "a", "b"], timeout=20.0)

        reader = threading.Thread(target=read)
        reader.start()
        while srv.stats["requests"] < 1:  # the multi_get is parked
            threading.Event().wait(0.01)
        client.set("a", b"1")
        client.delete("a")
        client.set("b", b"2")  # every key was set once, but "a" is gone again: keep waiting
        reader.join(0.5)
        assert reader.is_alive()
        client.set("a", b"3")
        reader.join(20)
        assert got["values"] == [b"3", b"3", b"2"]


def test_subscribers_that_asked_alike_share_one_packed_answer_with_the_same_bytes() -> None:
    from types import SimpleNamespace

    from torchcomms.control import protocol as proto
    from torchcomms.control.event_log import EventLog

    for value in (None, "pong", [1, "x", {"a": [2.5, b"\x00"]}], {"k": list(range(300))}, 2**40):
        for rid in (None, 0, 1, 127, 128, 65536, 2**33):
            assert proto.encode_ok_packed(rid, proto.encode(value)) == proto.encode_ok(rid, value)
    replies = _Replies()
    store = KeyValueStore(Limits(), replies, max_pending=10_000)
    log = EventLog(100, 1 << 20)
    log.append("rank_failed", {"rank": 3}, "run")  # seq 1: before every wait below
    asks = [(0, ["rank_failed"]), (1, ["rank_failed"]), (0, None), (0, ["joined"])]
    for i, (since, topics) in enumerate(asks * 50):
        args: dict[str, Any] = {"since": since, "timeout": 60.0}
        if topics is not None:
            args["topics"] = topics
        store.park_events(b"peer%d" % i, SimpleNamespace(id=i + 1, op="events", args=args))
    lookups = []

    def find(since: int, topics: list[str] | None) -> list:
        lookups.append((since, topics))
        return log.after(since, topics)

    log.append("rank_failed", {"rank": 5}, "run")  # seq 2
    store.wake_event_waiters("rank_failed", find)
    assert len(lookups) == 3  # one per distinct question, not one per subscriber
    for i, (since, topics) in enumerate(asks * 50):
        got = replies.ok_replies.get(i + 1)
        if topics == ["joined"]:
            assert got is None  # still parked
        else:
            assert got == [e.to_wire() for e in log.after(since, topics)], (since, topics, got)
            assert [e[0] for e in got] == ([1, 2] if since == 0 else [2])
    assert len(store.event_waiters) == 50
