"""Failure behaviour: dead clients, a dead or absent server, closing under load."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from torchcomms.control.client import ControlClient
from torchcomms.control.errors import ControlCancelledError, ControlClosedError, ControlUnavailableError
from torchcomms.control.secrets import new_secret
from torchcomms.control.server import StoreServer

from .conftest import spawn_python, stop_process

BLOCKED_GETTER = """
import sys
from torchcomms.control.client import ControlClient
c = ControlClient(sys.argv[1], bytes.fromhex(sys.argv[2]), timeout=60)
c.set("victim/ready", b"1")
c.get("shared-key", timeout=60)   # blocks until killed
"""


def test_client_killed_mid_wait_disturbs_no_one(server: StoreServer, secret: bytes,
                                                client: ControlClient) -> None:
    victim = spawn_python(BLOCKED_GETTER, server.address, secret.hex())
    try:
        client.wait(["victim/ready"], timeout=30)
        result: dict[str, bytes] = {}
        survivor = threading.Thread(
            target=lambda: result.setdefault("v", client.get("shared-key", timeout=30)))
        survivor.start()
        time.sleep(0.3)  # both are parked on the same key now
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        assert victim.returncode == -signal.SIGKILL
        # the store keeps serving everyone else, including the waiter on the same key
        client.set("other", b"1")
        assert client.get("other") == b"1"
        client.set("shared-key", b"payload")
        survivor.join(10)
        assert result == {"v": b"payload"}
        assert client.ping() >= 0
    finally:
        stop_process(victim)


def test_server_stop_fails_blocked_calls_promptly(secret: bytes) -> None:
    srv = StoreServer("127.0.0.1", 0, secret).start()
    c = ControlClient(srv.address, secret, timeout=60)
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            c.get("never", timeout=60)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=blocked)
    thread.start()
    time.sleep(0.2)
    start = time.monotonic()
    srv.stop()
    thread.join(20)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ControlUnavailableError)
    assert time.monotonic() - start < 10  # not the 60 s wait
    c.close()


def test_server_killed_while_idle_then_call_fails_after_timeout(secret: bytes) -> None:
    srv = StoreServer("127.0.0.1", 0, secret).start()
    c = ControlClient(srv.address, secret, timeout=1.0)
    c.set("k", b"v")
    srv.stop()
    start = time.monotonic()
    with pytest.raises(ControlUnavailableError):
        c.get("k", timeout=0.5)
    assert time.monotonic() - start < 0.5 + 2.0 + 2.0  # wait + reply grace + margin
    c.close()


def test_no_server_at_all_is_unavailable_after_the_timeout() -> None:
    import socket
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with ControlClient(f"tcp://127.0.0.1:{port}", new_secret(), timeout=0.5) as c:
        start = time.monotonic()
        with pytest.raises(ControlUnavailableError, match="could not reach"):
            c.set("k", b"v")
        assert 0.5 <= time.monotonic() - start < 5


def test_close_interrupts_a_blocked_call(server: StoreServer, secret: bytes) -> None:
    c = ControlClient(server.address, secret, timeout=60)
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            c.get("never", timeout=60)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=blocked)
    thread.start()
    time.sleep(0.2)
    c.close()
    thread.join(10)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ControlClosedError)
    with pytest.raises(ControlClosedError):
        c.set("k", b"v")
    c.close()  # idempotent


def test_stale_replies_are_ignored(server: StoreServer, secret: bytes) -> None:
    """A call abandoned on the client side leaves no reply for the next call to misread."""
    with ControlClient(server.address, secret, timeout=5) as c:
        for i in range(20):
            c.set(f"s/{i}", str(i).encode())
            assert c.get(f"s/{i}") == str(i).encode()


def test_client_cannot_be_pickled(client: ControlClient) -> None:
    import pickle
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(client)


def test_server_argument_errors(secret: bytes) -> None:
    from torchcomms.control.errors import ControlArgumentError
    with pytest.raises(ControlArgumentError, match="port"):
        StoreServer("127.0.0.1", 70000, secret)
    with pytest.raises(ControlArgumentError, match="heartbeat_limit"):
        StoreServer("127.0.0.1", 0, secret, heartbeat_limit=0)
    with pytest.raises(ControlArgumentError, match="host"):
        StoreServer("", 0, secret)


def test_port_in_use_is_a_clear_error(server: StoreServer, secret: bytes) -> None:
    with pytest.raises(ControlUnavailableError, match="cannot bind"):
        StoreServer("127.0.0.1", server.port, secret).start()


def test_client_address_validation(secret: bytes) -> None:
    from torchcomms.control.errors import ControlArgumentError, ControlArgumentTypeError
    with pytest.raises(ControlArgumentError, match="tcp://host:port"):
        ControlClient("localhost:1234", secret)
    with pytest.raises(ControlArgumentError, match="valid port"):
        ControlClient("tcp://localhost:notaport", secret)
    with pytest.raises(ControlArgumentTypeError):
        ControlClient(1234, secret)  # type: ignore[arg-type]


def test_too_many_blocked_requests_is_a_limit_error(secret: bytes) -> None:
    from torchcomms.control.errors import ControlLimitError
    with StoreServer("127.0.0.1", 0, secret, max_pending=2) as srv, \
            ControlClient(srv.address, secret, timeout=10) as c:
        threads = [threading.Thread(target=lambda: _swallow(c, f"p/{i}")) for i in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.3)  # both parked
        with pytest.raises(ControlLimitError, match="blocked requests"):
            c.get("p/third", timeout=5)
        c.set("p/0", b"")
        c.set("p/1", b"")
        for t in threads:
            t.join(10)
        assert c.get("p/0", timeout=1) == b""  # room again


def _swallow(c: ControlClient, key: str) -> None:
    c.get(key, timeout=8)


def test_cancel_calls_of_fails_only_that_threads_calls(client: ControlClient) -> None:
    """A thread whose caller gave up on it (an abandoned engine rendezvous) is cancelled: its
    blocked call ends within a poll slice, its later calls fail at once; other threads go on."""
    errors: list[BaseException] = []
    parked = threading.Event()

    def blocked() -> None:
        parked.set()
        try:
            client.get("never", timeout=30)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        try:
            client.set("after", b"1")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=blocked)
    t.start()
    parked.wait(5)
    time.sleep(0.2)  # parked in the get now
    start = time.monotonic()
    client.cancel_calls_of(t)
    t.join(5)
    assert not t.is_alive() and time.monotonic() - start < 1.0
    assert [type(e) for e in errors] == [ControlCancelledError, ControlCancelledError], errors
    client.set("mine", b"2")  # the other threads' calls are not affected
    assert client.get("mine") == b"2" and not client.check(["after"])
