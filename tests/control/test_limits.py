"""The server's protections at cluster size, over real sockets: strangers' connections are
closed after the handshake window, idle or flooding peers do not starve the job's clients, and
heartbeats are paced to the server's beat rate."""

from __future__ import annotations

import itertools
import select
import socket
import time
from collections.abc import Iterator

import msgpack
import pytest
import zmq

from torchcomms.control.arguments import check_server_args
from torchcomms.control.auth import configure_client_socket
from torchcomms.control.client import ControlClient
from torchcomms.control.errors import ControlArgumentError
from torchcomms.control.router import raise_open_file_limit
from torchcomms.control.secrets import derive_keys, new_secret
from torchcomms.control.server import StoreServer

HANDSHAKE_S = 0.5


@pytest.fixture
def strict_server(secret: bytes) -> Iterator[StoreServer]:
    srv = StoreServer("127.0.0.1", 0, secret, handshake_s=HANDSHAKE_S)
    srv.start()
    yield srv
    srv.stop()


def _closed_by_peer(sock: socket.socket, within: float) -> bool:
    """Read (and drop) what the peer sends until it closes the connection; False if it is
    still open after ``within`` seconds."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sock], [], [], left)
        if not ready:
            continue
        try:
            if not sock.recv(4096):
                return True
        except ConnectionError:
            return True
    return False


def _raw_connections(server: StoreServer, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(count)]


def test_silent_stranger_is_disconnected_after_the_handshake_window(strict_server: StoreServer) -> None:
    # a TCP peer that never speaks ZMTP/CURVE: closed once the handshake window ends (the
    # libzmq default would keep it for 30 s)
    sock = _raw_connections(strict_server, 1)[0]
    try:
        started = time.monotonic()
        assert _closed_by_peer(sock, within=HANDSHAKE_S + 10.0)
        assert time.monotonic() - started >= HANDSHAKE_S * 0.9
    finally:
        sock.close()


def test_default_handshake_window_closes_strangers(secret: bytes) -> None:
    with StoreServer("127.0.0.1", 0, secret) as srv:
        sock = _raw_connections(srv, 1)[0]
        try:
            assert _closed_by_peer(sock, within=srv.handshake_s + 10.0)
        finally:
            sock.close()


def test_wrong_key_client_is_disconnected(strict_server: StoreServer) -> None:
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        configure_client_socket(sock, derive_keys(new_secret()))
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                          | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                                          | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
        sock.connect(strict_server.address)
        assert monitor.poll(int((HANDSHAKE_S + 10.0) * 1000)), "a refused client stayed connected"
        monitor.close(0)
        sock.close(0)
    finally:
        ctx.term()


def test_client_is_served_among_hundreds_of_idle_strangers(strict_server: StoreServer,
                                                           secret: bytes) -> None:
    strangers = _raw_connections(strict_server, 300)
    try:
        with ControlClient(strict_server.address, secret, timeout=20.0) as client:
            client.set("k", b"v")
            assert client.get("k") == b"v"
        # and every stranger is gone after the window
        deadline = time.monotonic() + HANDSHAKE_S + 20.0
        for sock in strangers:
            assert _closed_by_peer(sock, within=max(0.1, deadline - time.monotonic()))
    finally:
        for sock in strangers:
            sock.close()


def test_peer_that_floods_without_reading_does_not_starve_others(strict_server: StoreServer,
                                                                 secret: bytes) -> None:
    ctx = zmq.Context()
    flood = ctx.socket(zmq.DEALER)
    flood.linger = 0
    flood.setsockopt(zmq.SNDHWM, 0)
    flood.setsockopt(zmq.RCVHWM, 1)  # reads nothing: the server's replies pile up, then drop
    configure_client_socket(flood, derive_keys(secret))
    flood.connect(strict_server.address)
    try:
        ids = itertools.count(1)
        for _ in range(30_000):
            flood.send(msgpack.packb({"id": next(ids), "op": "set", "key": "flood",
                                      "value": b"x" * 64}), zmq.NOBLOCK)
        with ControlClient(strict_server.address, secret, timeout=30.0) as client:
            for i in range(20):
                client.set(f"mine/{i}", b"1")
            assert client.ping() >= 0
            # the flood is served too (fair queueing drains it): its last write lands
            deadline = time.monotonic() + 60
            while strict_server.stats["requests"] < 30_000 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert client.get("flood") == b"x" * 64
        assert strict_server.stats["requests"] >= 30_000
    finally:
        flood.close(0)
        ctx.term()


def test_heartbeats_are_paced_to_the_server_beat_rate(secret: bytes) -> None:
    # 4 members beating every 0.1 s would be 40 beats/s; the server takes 8/s, so each is asked
    # to beat every 4 / 8 = 0.5 s and its limit stretches by the same factor (5x)
    with StoreServer("127.0.0.1", 0, secret, max_beat_rate=8.0, heartbeat_limit=1.0) as srv, \
            ControlClient(srv.address, secret, timeout=10.0) as client:
        for i in range(3):
            assert client._call("heartbeat", {"member": f"node/{i}", "interval": 0.1,
                                              "limit": 0.4}, budget=10.0) is not None
        reply = client._call("heartbeat", {"member": "rank/9", "interval": 0.1, "limit": 0.4},
                             budget=10.0)
        assert reply["interval"] == pytest.approx(0.5)
        assert reply["limit"] == pytest.approx(2.0)
        # a member that does not say its interval gets at least four paced intervals
        reply = client._call("heartbeat", {"member": "rank/10"}, budget=10.0)
        assert reply["interval"] == pytest.approx(5 / 8)
        assert reply["limit"] == pytest.approx(max(1.0, 4 * 5 / 8))
        # under the rate, a member keeps its own interval and limit
        for name in ("node/0", "node/1", "node/2", "rank/10"):
            assert client.heartbeat_forget(name)
        reply = client._call("heartbeat", {"member": "rank/9", "interval": 0.5, "limit": 2.0},
                             budget=10.0)
        assert reply == {"interval": 0.5, "limit": 2.0}


def test_heartbeat_sender_follows_the_pace_and_is_not_reported(secret: bytes) -> None:
    with StoreServer("127.0.0.1", 0, secret, max_beat_rate=2.0, heartbeat_limit=1.0) as srv, \
            ControlClient(srv.address, secret, timeout=10.0) as client:
        client.heartbeat_start("rank/0", 0.05, limit=0.3)
        client.heartbeat_start("rank/1", 0.05, limit=0.3)
        senders = client._heartbeats
        # the second member's first beat made two members: 2 / 2.0 = 1 s between beats
        deadline = time.monotonic() + 10
        while any(s.pace < 1.0 for s in senders.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(s.pace == pytest.approx(1.0) for s in senders.values())
        # beating every second with a stretched limit (0.3 * 1 / 0.05 = 6 s): nobody is lost
        time.sleep(2.5)
        assert client.events(0, topics=["rank_failed"]) == []
        client.heartbeat_stop()


def test_server_argument_errors() -> None:
    for bad in (0, -1.0, float("inf"), True, "10"):
        with pytest.raises(ControlArgumentError, match="max_beat_rate"):
            check_server_args("127.0.0.1", 0, 1.0, 10, 10, "failed", bad, 1.0)
    for bad in (0, -1, 3601, False, None):
        with pytest.raises(ControlArgumentError, match="handshake_s"):
            check_server_args("127.0.0.1", 0, 1.0, 10, 10, "failed", 10.0, bad)


def test_open_file_limit_is_raised_to_the_hard_limit() -> None:
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard != resource.RLIM_INFINITY and hard > 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        assert raise_open_file_limit() == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if hard != resource.RLIM_INFINITY:
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_no_per_peer_zmtp_timers(strict_server: StoreServer, secret: bytes) -> None:
    # libzmq cancels a timer by walking all timers of its I/O thread; ZMTP heartbeats re-arm one
    # per ping per peer, which at 4,096 peers starved the I/O thread (replies never sent). The
    # server arms none, and clients ask it for no heartbeat TTL; dead peers go by TCP keepalive.
    router = strict_server._router
    assert router is not None
    assert router.getsockopt(zmq.HEARTBEAT_IVL) == 0
    assert router.getsockopt(zmq.HEARTBEAT_TIMEOUT) in (-1, 0)
    assert router.getsockopt(zmq.TCP_KEEPALIVE) == 1 and router.getsockopt(zmq.TCP_KEEPALIVE_CNT) > 0
    with ControlClient(strict_server.address, secret, timeout=10.0) as client:
        client.ping()
        channel = client._conn.new_channel()
        try:
            assert channel.sock.getsockopt(zmq.HEARTBEAT_TTL) == 0
        finally:
            client._conn.discard_channel(channel)
