"""Garbage on an authenticated socket gets error replies; the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchcomms.control.client import ControlClient
from torchcomms.control.protocol import SCHEMA, Reply, decode_reply, encode
from torchcomms.control.secrets import derive_keys
from torchcomms.control.server import StoreServer


class RawPeer:
    """An authenticated DEALER that sends arbitrary frames."""

    def __init__(self, server: StoreServer, secret: bytes) -> None:
        keys = derive_keys(secret)
        self.limits = server.limits
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.curve_secretkey = keys.client_secret
        self.sock.curve_publickey = keys.client_public
        self.sock.curve_serverkey = keys.server_public
        self.sock.linger = 0
        self.sock.connect(server.address)

    def exchange(self, *frames: bytes) -> Reply:
        self.sock.send_multipart(list(frames))
        assert self.sock.poll(5000), "the server did not answer"
        return decode_reply(self.sock.recv(), self.limits)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def peer(small_server: StoreServer, secret: bytes) -> Iterator[RawPeer]:
    p = RawPeer(small_server, secret)
    yield p
    p.close()


def assert_still_serving(server: StoreServer, secret: bytes) -> None:
    with ControlClient(server.address, secret, timeout=10) as c:
        c.set("alive", b"yes")
        assert c.get("alive") == b"yes"


plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
ops = st.sampled_from(sorted(SCHEMA))
field_names = st.sampled_from(sorted({f for fields in SCHEMA.values() for f in fields}
                                     | {"id", "op", "bogus"}))


WAITING_OPS = {"get", "wait", "multi_get", "events", "queue_pop"}


@st.composite
def wrong_requests(draw: st.DrawFn) -> dict[str, object]:
    """Requests with a real op and random (mostly wrong) fields."""
    message: dict[str, object] = {"id": draw(st.integers(0, 2**31)), "op": draw(ops)}
    for name in draw(st.lists(field_names, max_size=4)):
        message[name] = draw(plain)
    if isinstance(message["op"], str) and message["op"] in WAITING_OPS:
        message["timeout"] = 0  # a valid blocking request must not park for long
    return message


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frame=st.binary(max_size=200))
def test_random_bytes(peer: RawPeer, frame: bytes) -> None:
    reply = peer.exchange(frame)
    # random bytes are almost never a valid request; when they are, they got a normal answer
    if not reply.ok:
        assert reply.code in ("protocol", "limit")
        assert reply.message


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(message=wrong_requests())
def test_wrong_fields(peer: RawPeer, message: dict[str, object]) -> None:
    try:
        frame = msgpack.packb(message, use_bin_type=True)
    except (OverflowError, ValueError):
        return
    reply = peer.exchange(frame)
    assert reply.id in (message["id"], None) or reply.ok
    if not reply.ok:
        assert reply.code in ("protocol", "limit", "value", "timeout")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_truncated_valid_requests(peer: RawPeer, data: st.DataObject) -> None:
    frame = encode({"id": 5, "op": "set", "key": "truncated", "value": b"v" * 50})
    cut = data.draw(st.integers(0, len(frame) - 1))
    reply = peer.exchange(frame[:cut])
    assert not reply.ok and reply.code == "protocol"


def test_oversized_value_and_message_get_limit_errors(peer: RawPeer, small_server: StoreServer,
                                                      secret: bytes) -> None:
    limits = small_server.limits
    reply = peer.exchange(encode({"id": 1, "op": "set", "key": "k",
                                  "value": b"x" * (limits.max_value_bytes + 1)}))
    assert (reply.id, reply.ok, reply.code) == (1, False, "limit")
    reply = peer.exchange(b"\x00" * (limits.max_message_bytes + 10))
    assert not reply.ok and reply.code == "limit"
    reply = peer.exchange(encode({"id": 2, "op": "set", "key": "k" * (limits.max_key_bytes + 1),
                                  "value": b""}))
    assert (reply.id, reply.code) == (2, "limit")
    assert_still_serving(small_server, secret)


def test_frames_beyond_the_hard_limit_cut_the_sender_off(small_server: StoreServer,
                                                        secret: bytes) -> None:
    peer = RawPeer(small_server, secret)
    try:
        peer.sock.send(b"\x00" * (small_server.limits.hard_message_bytes + 1))
        assert peer.sock.poll(500) == 0  # dropped by ZeroMQ's MAXMSGSIZE, no reply
    finally:
        peer.close()
    assert_still_serving(small_server, secret)


def test_multipart_and_empty_messages(peer: RawPeer, small_server: StoreServer,
                                      secret: bytes) -> None:
    reply = peer.exchange(encode({"id": 1, "op": "ping"}), b"extra")
    assert not reply.ok and "one message frame" in reply.message
    reply = peer.exchange(b"")
    assert not reply.ok and reply.code == "protocol"
    reply = peer.exchange(encode({"id": 3, "op": "ping"}))
    assert reply.ok and reply.value == "pong"
    assert_still_serving(small_server, secret)


def test_nested_payload_bomb_is_refused(peer: RawPeer) -> None:
    payload: object = "leaf"
    for _ in range(40):
        payload = {"x": payload}
    reply = peer.exchange(encode({"id": 4, "op": "publish", "topic": "custom",
                                  "payload": payload}))
    assert (reply.ok, reply.code) == (False, "protocol")
    assert "nests deeper" in reply.message


def test_server_survives_the_whole_fuzz_run(small_server: StoreServer, secret: bytes) -> None:
    peer = RawPeer(small_server, secret)
    try:
        for frame in (b"\xdc\xff\xff", b"\x91" * 1000, b"\xc7\x05\x01abcde", b"\x81\xa2id"):
            peer.exchange(frame)
    finally:
        peer.close()
    assert_still_serving(small_server, secret)
