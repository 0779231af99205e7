"""Authentication: only clients holding the job secret are served."""

from __future__ import annotations

import logging
import time

import pytest
import zmq

from torchcomms.control.client import ControlClient
from torchcomms.control.errors import ControlAuthError, ControlHandshakeTimeoutError
from torchcomms.control.protocol import decode_reply, encode
from torchcomms.control.secrets import derive_keys, new_secret
from torchcomms.control.server import StoreServer


def test_wrong_secret_raises_auth_error_promptly(server: StoreServer) -> None:
    with ControlClient(server.address, new_secret(), timeout=20) as intruder:
        start = time.monotonic()
        with pytest.raises(ControlAuthError, match="secret does not match"):
            intruder.set("k", b"v")
        assert time.monotonic() - start < 10  # detected from the handshake, not the timeout


def test_right_server_key_wrong_client_key_is_refused_by_zap(server: StoreServer,
                                                             secret: bytes,
                                                             client: ControlClient) -> None:
    """A peer that knows the server's public key but not the job secret."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        mine = derive_keys(new_secret())
        sock.curve_secretkey, sock.curve_publickey = mine.client_secret, mine.client_public
        sock.curve_serverkey = derive_keys(secret).server_public
        sock.linger = 0
        sock.connect(server.address)
        sock.send(encode({"id": 1, "op": "set", "key": "stolen", "value": b"x"}))
        assert sock.poll(1000) == 0  # never answered
    finally:
        sock.close(0)
        ctx.term()
    assert server.refused_handshakes >= 1
    assert not client.check(["stolen"])


def test_client_without_curve_gets_no_service(server: StoreServer,
                                              client: ControlClient) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.linger = 0
        sock.connect(server.address)
        sock.send(encode({"id": 1, "op": "set", "key": "plain", "value": b"x"}))
        assert sock.poll(1000) == 0
    finally:
        sock.close(0)
        ctx.term()
    assert not client.check(["plain"])
    client.set("after", b"ok")
    assert client.get("after") == b"ok"


def test_plain_tcp_garbage_does_not_disturb_the_server(server: StoreServer,
                                                       client: ControlClient) -> None:
    import socket
    host, port = server.address[len("tcp://"):].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 4)
        time.sleep(0.1)
    assert client.ping() >= 0


def test_authenticated_raw_socket_is_served(server: StoreServer, secret: bytes) -> None:
    """The wire format in the docs is all a client needs (no hidden state)."""
    keys = derive_keys(secret)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.curve_secretkey, sock.curve_publickey = keys.client_secret, keys.client_public
        sock.curve_serverkey = keys.server_public
        sock.linger = 0
        sock.connect(server.address)
        sock.send(encode({"id": 9, "op": "ping"}))
        assert sock.poll(5000)
        reply = decode_reply(sock.recv(), server.limits)
        assert (reply.id, reply.ok, reply.value) == (9, True, "pong")
    finally:
        sock.close(0)
        ctx.term()


def test_silent_peer_is_reported_as_an_unanswered_handshake_not_a_refused_secret() -> None:
    """A listener that accepts TCP but never speaks ZMTP/CURVE (what a stopped server looks
    like: the kernel accepts for it) is silence at the timeout. It used to be reported as a
    refused job secret (``ControlAuthError``), which sent users after the wrong problem."""
    import socket
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel completes connections; nobody ever answers
        port = listener.getsockname()[1]
        with ControlClient(f"tcp://127.0.0.1:{port}", new_secret(), timeout=0.5) as c:
            with pytest.raises(ControlHandshakeTimeoutError, match="handshake was not answered") as info:
                c.ping()
            assert "the server is stopped or hung" in str(info.value)
            assert not isinstance(info.value, ControlAuthError)


def test_refusals_are_logged_once_then_summed_up(caplog: pytest.LogCaptureFixture) -> None:
    from torchcomms.control.auth import REFUSAL_LOG_INTERVAL_S, _SingleKeyProvider

    now = [0.0]
    provider = _SingleKeyProvider(b"A" * 40, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="torchcomms.control.auth"):
        for _ in range(1000):
            assert provider.callback("torchcomms-control", b"B" * 40) is False
        now[0] = REFUSAL_LOG_INTERVAL_S
        assert provider.callback("torchcomms-control", b"B" * 40) is False
        assert provider.callback("torchcomms-control", b"A" * 40) is True
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "refused a client with an unknown CURVE key" in lines[0]
    assert "refused 1000 clients with an unknown CURVE key (1001 in all)" in lines[1]
    assert provider.refused == 1001


def test_strangers_handshaking_over_and_over_are_one_log_line(secret: bytes, caplog: pytest.LogCaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Twenty handshakes with wrong keys, one after another."""
    from torchcomms.control import auth

    monkeypatch.setattr(auth, "REFUSAL_LOG_INTERVAL_S", 1e9, raising=False)  # no summary in the test
    ctx = zmq.Context()
    try:
        with caplog.at_level(logging.WARNING, logger="torchcomms.control.auth"), \
                StoreServer("127.0.0.1", 0, secret) as srv:
            for attempt in range(1, 21):
                sock = ctx.socket(zmq.DEALER)
                sock.linger = 0
                sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
                sock.curve_serverkey = derive_keys(secret).server_public
                sock.connect(srv.address)
                deadline = time.monotonic() + 60
                while srv.refused_handshakes < attempt and time.monotonic() < deadline:
                    time.sleep(0.01)
                sock.close(0)
                assert srv.refused_handshakes == attempt
    finally:
        ctx.term()
    refusals = [r for r in caplog.records if "unknown CURVE key" in r.getMessage()]
    assert len(refusals) == 1
