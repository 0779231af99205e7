"""Finding one gloo engine's TCP connections in /proc (torchcomms/backends/gloo_sockets.py)."""
from __future__ import annotations

import socket
import sys

import pytest

from torchcomms.backends import gloo_sockets as gs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_a_pass_that_skips_a_socket_is_read_again_and_merged(monkeypatch) -> None:
    # the kernel writes /proc/net/tcp a chunk per read: on a busy host one pass can miss an entry
    passes = iter([{1: ("A", "B", "01")}, {1: ("A", "B", "01"), 2: ("C", "D", "0A")}])
    monkeypatch.setattr(gs, "_tcp_table", lambda: next(passes))
    assert gs._tcp_endpoints({1, 2}) == {1: ("A", "B", "01"), 2: ("C", "D", "0A")}


def test_reads_stop_when_every_wanted_socket_is_found(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(gs, "_tcp_table", lambda: calls.append(1) or {7: ("A", "B", "01")})
    assert gs._tcp_endpoints({7}) == {7: ("A", "B", "01")}
    assert len(calls) == 1
    gs._tcp_endpoints({7, 8})  # 8 is not a TCP socket: a bounded number of passes
    assert len(calls) == 1 + gs._TABLE_READS


def test_records_the_connections_an_engine_opens_and_shuts_them_down() -> None:
    probe = gs.EngineSockets()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    probe.device_created()
    assert probe.listener is not None and probe.listener.endswith(f":{listener.getsockname()[1]:04X}")
    client = socket.create_connection(listener.getsockname())
    served, _ = listener.accept()
    try:
        # the accepted socket touches this engine's listener; the connected one a "peer's" (the same here)
        probe.engine_created([probe.listener])
        assert sorted(probe.fds) == sorted([client.fileno(), served.fileno()])
        assert probe.shut_down() == 2
        assert client.recv(1) == b""  # shut down: the peer sees end of stream
    finally:
        for s in (client, served, listener):
            s.close()
