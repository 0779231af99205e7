"""The client checks the server's replies as the server checks requests: a reply of the wrong
shape is a :class:`ControlProtocolError` naming the op, never a value built from it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
import zmq

from torchcomms.control.auth import configure_server_socket
from torchcomms.control.client import ControlClient
from torchcomms.control.errors import ControlProtocolError
from torchcomms.control.protocol import encode_ok
from torchcomms.control.secrets import derive_keys, new_secret


class ScriptedServer:
    """A CURVE server holding the job's keys that answers each op with ``answers[op]``."""

    def __init__(self, secret: bytes, answers: dict[str, Any]) -> None:
        self.answers = answers
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        configure_server_socket(self._sock, derive_keys(secret))
        self._sock.bind("tcp://127.0.0.1:*")
        self.address = self._sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(50):
                continue
            identity, frame = self._sock.recv_multipart()
            request = msgpack.unpackb(frame, raw=False)
            self._sock.send_multipart([identity, encode_ok(request["id"], self.answers[request["op"]])])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(0)
        self._ctx.term()


@pytest.fixture
def scripted() -> Iterator[Callable[[dict[str, Any]], ControlClient]]:
    made: list[tuple[ScriptedServer, ControlClient]] = []

    def make(answers: dict[str, Any]) -> ControlClient:
        secret = new_secret()
        server = ScriptedServer(secret, answers)
        client = ControlClient(server.address, secret, timeout=10.0)
        made.append((server, client))
        return client

    yield make
    for server, client in made:
        client.close()
        server.close()


# (method call, op, a reply of the wrong shape)
CASES: list[tuple[Callable[[ControlClient], Any], str, Any]] = [
    (lambda c: c.compare_set("k", b"", b"v"), "compare_set", 1 << 40),  # bytes(1 << 40): a TiB
    (lambda c: c.queue_pop("q", timeout=1), "queue_pop", 1 << 40),
    (lambda c: c.add("k", 1), "add", "12"),
    (lambda c: c.add("k", 1), "add", True),
    (lambda c: c.num_keys(), "num_keys", 2.5),
    (lambda c: c.queue_len("q"), "queue_len", None),
    (lambda c: c.delete_prefix("p/"), "delete_prefix", "3"),
    (lambda c: c.delete("k"), "delete", "no"),
    (lambda c: c.check(["k"]), "check", [1]),
    (lambda c: c.keys("p/"), "keys", "p/abc"),
    (lambda c: c.keys("p/"), "keys", ["p/a", 7]),
    (lambda c: c.multi_get(["a", "b"], timeout=1), "multi_get", [b"x", "y"]),
    (lambda c: c.multi_get(["a", "b"], timeout=1), "multi_get", [b"only one"]),
    (lambda c: c.publish("mine", {}), "publish", "1"),
    (lambda c: c.events(0), "events", None),
    (lambda c: c.events(0), "events", [[1, "t"]]),
    (lambda c: c.heartbeat_forget("rank/1"), "heartbeat_stop", "yes"),
    (lambda c: c.hello(), "hello", ["version", 1]),
    (lambda c: c.subscribe(None, lambda topic, payload: None, since=None), "hello", {"version": 1}),
]


@pytest.mark.parametrize("call,op,reply", CASES, ids=[f"{op}-{type(r).__name__}" for _, op, r in CASES])
def test_a_reply_of_the_wrong_shape_is_a_protocol_error(scripted: Callable[[dict[str, Any]], ControlClient],
                                                        call: Callable[[ControlClient], Any], op: str,
                                                        reply: Any) -> None:
    client = scripted({op: reply})
    with pytest.raises(ControlProtocolError, match=f"malformed {op} reply from the control server"):
        call(client)


def test_replies_of_the_right_shape_pass(scripted: Callable[[dict[str, Any]], ControlClient]) -> None:
    client = scripted({"compare_set": b"v", "add": 3, "keys": ["p/a"], "multi_get": [b"1", b"2"],
                       "events": [[1, "t", {"x": 1}]], "check": True})
    assert client.compare_set("k", b"", b"v") == b"v"
    assert client.add("k", 3) == 3
    assert client.keys("p/") == ["p/a"]
    assert client.multi_get(["a", "b"]) == [b"1", b"2"]
    assert client.events(0) == [(1, "t", {"x": 1})]
    assert client.check("k") is True
