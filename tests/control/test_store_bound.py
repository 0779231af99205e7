"""The store's memory is bounded: past ``Limits.max_store_bytes`` writes get a ``limit`` error,
deletes and pops give the room back, and the server's own events are never refused."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import msgpack
import pytest

from torchcomms.control.client import ControlClient
from torchcomms.control.errors import ControlLimitError
from torchcomms.control.kvstore import OBJECT_BYTES
from torchcomms.control.membership import MEMBER_BYTES
from torchcomms.control.protocol import Limits
from torchcomms.control.server import StoreServer

BOUND = 10_000


@pytest.fixture
def bounded(secret: bytes) -> Iterator[tuple[StoreServer, ControlClient]]:
    srv = StoreServer("127.0.0.1", 0, secret, limits=Limits(max_store_bytes=BOUND)).start()
    client = ControlClient(srv.address, secret, timeout=10.0)
    yield srv, client
    client.close()
    srv.stop()


def _held(srv: StoreServer) -> int:
    return int(srv._run_in_loop(lambda: srv._store.held_bytes, 10.0))


def test_writes_past_the_bound_are_refused_and_deletes_give_room_back(
        bounded: tuple[StoreServer, ControlClient]) -> None:
    srv, client = bounded
    for i in range(9):
        client.set(f"k{i}", b"x" * 1000)  # 9 * (2 + 1000) bytes
    assert _held(srv) == 9018
    with pytest.raises(ControlLimitError, match=r"set failed: storing key 'k9' \(1002 bytes more\) would "
                                                r"pass the store's limit of 10000 bytes \(it holds 9018\)"):
        client.set("k9", b"x" * 1000)
    with pytest.raises(ControlLimitError, match="append failed"):
        client.append("k0", b"y" * 1000)
    with pytest.raises(ControlLimitError, match="queue_push failed: .*an item of queue 'q'"):
        client.queue_push("q", b"z" * 1000)
    with pytest.raises(ControlLimitError, match="multi_set failed: .*2 keys"):
        client.multi_set(["new1", "new2"], [b"a" * 500, b"b" * 500])
    assert not client.check(["new1"]) and not client.check(["new2"])  # all or nothing
    client.set("k0", b"small")  # an overwrite that shrinks is always taken
    client.set("k9", b"x" * 995)
    assert client.delete("k1")
    assert client.delete_prefix("k") == 9
    assert _held(srv) == 0
    client.queue_push("q", b"z" * 6000)
    with pytest.raises(ControlLimitError):
        client.set("k", b"x" * 5000)
    assert client.queue_pop("q") == b"z" * 6000
    client.set("k", b"x" * 5000)
    assert srv.drop_keys_except(()) == 1
    assert _held(srv) == 0


def test_the_servers_own_events_are_kept_when_the_store_is_full(
        bounded: tuple[StoreServer, ControlClient]) -> None:
    srv, client = bounded
    client.set("fill", b"x" * (BOUND - 4))
    seq = srv.publish("rank_failed", {"rank": 3, "reason": "exited"})
    assert [(s, t, p["rank"]) for s, t, p in client.events(0)] == [(seq, "rank_failed", 3)]
    assert client.publish("mine", {"note": "x" * 2000}) == seq + 1  # an event, not a user write


def test_the_event_history_keeps_its_newest_records_within_its_byte_bound(secret: bytes) -> None:
    limits = Limits(max_event_log_bytes=10_000)
    with StoreServer("127.0.0.1", 0, secret, limits=limits) as srv, \
            ControlClient(srv.address, secret, timeout=10.0) as client:
        for i in range(30):
            client.publish("note", {"i": i, "text": "x" * 1000})
        kept = client.events(0)
        assert [p["i"] for _, _, p in kept] == list(range(30 - len(kept), 30))
        assert 5 <= len(kept) < 10  # ~1,050 bytes a record in 10,000
        assert client.keys("events/") == [f"events/{s:08d}" for s, _, _ in kept]
        assert _held(srv) < 10_000 + 200  # the records' keys besides
        client.publish("big", {"text": "y" * 20_000})  # past the bound alone: still kept, alone
        assert [t for _, t, _ in client.events(0)] == ["big"]



def _pending(srv: StoreServer) -> tuple[int, int]:
    return srv._run_in_loop(lambda: (srv._store.pending, srv._store.pending_bytes), 10.0)


def _park(call: Callable[[], object], srv: StoreServer, count: int) -> tuple[threading.Thread, list[object]]:
    """Run the blocking ``call`` on a thread; return once the server holds ``count`` parked requests."""
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    limit = time.monotonic() + 30
    while _pending(srv)[0] < count and time.monotonic() < limit:
        time.sleep(0.01)
    return thread, out


def test_blocked_requests_are_bounded_by_the_bytes_of_the_keys_they_wait_for(secret: bytes) -> None:
    """Parked requests hold their keys until answered; past ``Limits.max_pending_bytes`` a
    blocking request is refused at once with a ``limit`` error (the count bound alone let a
    member park 100,000 requests of 100,000 long keys each), and answering gives the room back."""
    long_keys = [f"wait/{i:04d}/" + "k" * 1000 for i in range(4)]  # 1,010 characters each
    held = OBJECT_BYTES * 5 + sum(map(len, long_keys))
    bound = held + 500
    with StoreServer("127.0.0.1", 0, secret, limits=Limits(max_pending_bytes=bound)).start() as srv, \
            ControlClient(srv.address, secret, timeout=30.0) as waiter, \
            ControlClient(srv.address, secret, timeout=30.0) as other:
        thread, out = _park(lambda: waiter.wait(long_keys, timeout=60), srv, 1)
        assert _pending(srv) == (1, held)
        with pytest.raises(ControlLimitError, match=rf"multi_get failed: multi_get: blocking on 1 key \(728 bytes\) "
                                                    rf"would pass the server's limit of {bound} bytes "
                                                    rf"of blocked requests "
                                                    rf"\(it holds {held} in 1\)"):
            other.multi_get(["x" * 600], timeout=60)
        for key in long_keys:
            other.set(key, b"")
        thread.join(30)
        assert out == [None] and _pending(srv) == (0, 0)
        thread, out = _park(lambda: waiter.multi_get(["x" * 600], timeout=60), srv, 1)  # room again
        other.set("x" * 600, b"v")
        thread.join(30)
        assert out == [[b"v"]]


def test_heartbeat_members_are_bounded_by_their_bytes(secret: bytes) -> None:
    """Members are held until they stop or fall silent; past ``Limits.max_member_bytes`` a new
    member (or a larger info) is refused with a ``limit`` error on its first beat, and a member
    that stops gives its room back (they were bounded by nothing: any number of members, each
    with an info of up to a megabyte)."""
    info = {"host": "h" * 3000}
    size = MEMBER_BYTES + len("rank/0") + len(msgpack.packb(info, use_bin_type=True))
    bound = 3 * size + 300
    held = lambda srv: srv._run_in_loop(lambda: srv._members.held_bytes, 10.0)  # noqa: E731
    with StoreServer("127.0.0.1", 0, secret, limits=Limits(max_member_bytes=bound)).start() as srv, \
            ControlClient(srv.address, secret, timeout=30.0) as client:
        for r in range(3):
            client.heartbeat_start(f"rank/{r}", 1.0, limit=30.0, info=info)
        assert held(srv) == 3 * size
        with pytest.raises(ControlLimitError, match=rf"heartbeat of 'rank/3': its {size} bytes would pass the server's "
                                                    rf"limit of {bound} bytes of heartbeat members \(it holds "
                                                    rf"{3 * size} for 3\)"):
            client.heartbeat_start("rank/3", 1.0, limit=30.0, info=info)
        client.heartbeat_start("rank/4", 1.0, limit=30.0)  # no info: small enough
        client.heartbeat_stop("rank/0")
        client.heartbeat_start("rank/3", 1.0, limit=30.0, info=info)
        assert held(srv) == 3 * size + MEMBER_BYTES + len("rank/4")
        client.heartbeat_stop()
        assert held(srv) == 0


def test_a_known_members_beat_is_taken_when_its_larger_info_does_not_fit() -> None:
    """A member already held keeps beating (it is never taken for silent) when a new, larger
    info would pass the bound: the old info stays, the beat counts."""
    from torchcomms.control.membership import Members

    members = Members("failed")
    small, large = {"host": "a"}, {"host": "b" * 5000}
    members.beat("rank/0", 1.0, small, now=0.0, max_bytes=1000)
    before = members.held_bytes
    members.beat("rank/0", 1.0, large, now=0.8, max_bytes=1000)
    assert members.held_bytes == before and members._members["rank/0"].info == small
    assert members.check(1.5) == []  # heard at 0.8: not silent past its 1 s limit
    assert [topic for topic, _ in members.check(2.0)] == ["rank_failed"]
    assert members.held_bytes == 0
