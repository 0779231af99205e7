"""The event bus: publish, subscribe, topic filters, replay, server-side publish."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import msgpack
import pytest

from torchcomms.control.client import ControlClient
from torchcomms.control.errors import ControlArgumentError, ControlArgumentTypeError
from torchcomms.control.server import StoreServer


class Inbox:
    def __init__(self) -> None:
        self.items: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()

    def __call__(self, topic: str, payload: dict[str, Any]) -> None:
        self.items.put((topic, payload))

    def take(self, timeout: float = 10.0) -> tuple[str, dict[str, Any]]:
        return self.items.get(timeout=timeout)

    def empty_for(self, seconds: float) -> bool:
        try:
            self.items.get(timeout=seconds)
        except queue.Empty:
            return True
        return False


def test_publish_and_subscribe(client: ControlClient, server: StoreServer,
                               secret: bytes) -> None:
    inbox = Inbox()
    with ControlClient(server.address, secret) as listener:
        sub = listener.subscribe("rank_failed", inbox)
        seq = client.publish("rank_failed", {"rank": 2, "reason": "exited", "exit_code": 1})
        topic, payload = inbox.take()
        assert topic == "rank_failed"
        assert payload["rank"] == 2 and payload["exit_code"] == 1
        assert payload["seq"] == seq
        assert payload["run_id"] == "test-run"
        assert abs(payload["ts"] - time.time()) < 60
        sub.close()


def test_topic_filter(client: ControlClient) -> None:
    inbox = Inbox()
    client.subscribe(["membership"], inbox)
    client.publish("job_stopping", {"reason": "done"})
    client.publish("membership", {"comm": "world", "epoch": 1, "ranks": [0, 1]})
    topic, payload = inbox.take()
    assert topic == "membership" and payload["epoch"] == 1
    assert inbox.empty_for(0.3)


def test_late_subscriber_replays_in_order(client: ControlClient) -> None:
    for i in range(5):
        client.publish("custom/topic", {"i": i})
    inbox = Inbox()
    client.subscribe(None, inbox)
    got = [inbox.take()[1]["i"] for _ in range(5)]
    assert got == [0, 1, 2, 3, 4]
    client.publish("custom/topic", {"i": 5})
    assert inbox.take()[1]["i"] == 5


def test_since_none_delivers_only_new_events(client: ControlClient) -> None:
    client.publish("custom", {"old": True})
    inbox = Inbox()
    client.subscribe(None, inbox, since=None)
    assert inbox.empty_for(0.2)
    client.publish("custom", {"old": False})
    assert inbox.take()[1] == {"old": False, "ts": pytest.approx(time.time(), abs=60),
                               "run_id": "test-run", "seq": 2}


def test_server_side_publish_reaches_subscribers(client: ControlClient,
                                                 server: StoreServer) -> None:
    inbox = Inbox()
    client.subscribe("rank_failed", inbox)
    seq = server.publish("rank_failed", {"rank": 7, "reason": "killed", "signal": 9,
                                         "host": "node-a"})
    topic, payload = inbox.take()
    assert (topic, payload["rank"], payload["signal"], payload["seq"]) == \
        ("rank_failed", 7, 9, seq)


def test_events_are_kept_in_the_store(client: ControlClient, server: StoreServer) -> None:
    seq = server.publish("job_stopping", {"reason": "test"})
    key = f"events/{seq:08d}"
    assert client.keys("events/") == [key]
    record = msgpack.unpackb(client.get(key), raw=False)
    assert record[0] == seq and record[1] == "job_stopping"
    assert record[2]["reason"] == "test"


def test_events_query_with_wait(client: ControlClient, server: StoreServer) -> None:
    assert client.events(0) == []
    publisher = threading.Timer(0.2, lambda: server.publish("job_stopping", {"reason": "x"}))
    publisher.start()
    got = client.events(0, timeout=10)
    publisher.join(5)  # done before the fixture stops the server
    assert [(seq, topic) for seq, topic, _ in got] == [(1, "job_stopping")]


def test_many_subscribers_all_get_every_event(client: ControlClient, server: StoreServer,
                                              secret: bytes) -> None:
    inboxes = [Inbox() for _ in range(6)]
    with ControlClient(server.address, secret) as listener:
        for inbox in inboxes:
            listener.subscribe("custom", inbox)
        for i in range(10):
            client.publish("custom", {"i": i})
        for inbox in inboxes:
            assert [inbox.take()[1]["i"] for _ in range(10)] == list(range(10))


def test_callback_errors_do_not_stop_delivery(client: ControlClient) -> None:
    inbox = Inbox()

    def flaky(topic: str, payload: dict[str, Any]) -> None:
        if payload["i"] == 0:
            raise RuntimeError("boom")
        inbox(topic, payload)

    client.subscribe("custom", flaky)
    client.publish("custom", {"i": 0})
    client.publish("custom", {"i": 1})
    assert inbox.take()[1]["i"] == 1


def test_closed_subscription_gets_nothing_more(client: ControlClient) -> None:
    inbox = Inbox()
    sub = client.subscribe("custom", inbox)
    client.publish("custom", {"i": 0})
    inbox.take()
    sub.close()
    assert sub.closed
    client.publish("custom", {"i": 1})
    assert inbox.empty_for(0.3)


@pytest.mark.parametrize("topic,payload,exc,match", [
    ("rank_failed", {"reason": "exited"}, ControlArgumentError, "lacks the field 'rank'"),
    ("rank_failed", {"rank": "3", "reason": "x"}, ControlArgumentError, "must be int"),
    ("node_lost", {"node_rank": 1, "ranks": 3, "reason": "x"}, ControlArgumentError,
     "must be list"),
    ("membership", {"comm": "w", "epoch": True, "ranks": []}, ControlArgumentError, "bool"),
    ("bad topic!", {}, ControlArgumentError, "topic"),
    ("custom", {"x": object()}, ControlArgumentError, "unsupported type"),
    ("custom", [1], ControlArgumentTypeError, "payload must be a dict"),
])
def test_publish_schema_errors(client: ControlClient, server: StoreServer, topic: str,
                               payload: Any, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        client.publish(topic, payload)
    if isinstance(payload, dict):
        with pytest.raises(ControlArgumentError, match=match):
            server.publish(topic, payload)


def test_subscribe_argument_errors(client: ControlClient) -> None:
    with pytest.raises(ControlArgumentTypeError, match="callable"):
        client.subscribe("x", "not callable")  # type: ignore[arg-type]
    with pytest.raises(ControlArgumentError, match="must not be empty"):
        client.subscribe([], lambda t, p: None)
    with pytest.raises(ControlArgumentError, match="since"):
        client.subscribe("x", lambda t, p: None, since=-1)
