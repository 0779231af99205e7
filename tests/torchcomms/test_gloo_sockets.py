"""Finding one gloo engine's TCP connections in /proc (torchcomms/backends/gloo_sockets.py)."""
from __future__ import annotations

import socket
import sys
import threading

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


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_records_the_connections_an_engine_opens_and_shuts_them_down() -> None:
    probe = gs.EngineSockets()
    listener = probe.open_device(_listening)
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


def test_engines_built_at_once_each_find_their_own_listener() -> None:
    """Two communicators reconfigured at once build their engines on two threads. Each device's
    listener used to be found as "the one new listening socket since this engine began": with
    both devices created in between, each saw two and recorded none, so aborting the engine
    could not shut its connections down (a survivor of an elastic job then died in gloo's C++
    when a peer closed one later). Here both devices open their listener, then wait for each
    other (at most 0.5 s)."""
    both = threading.Barrier(2, timeout=0.5)
    found: dict[int, tuple[str | None, int]] = {}

    def build(i: int) -> None:
        def create() -> socket.socket:
            s = _listening()
            try:
                both.wait()
            except threading.BrokenBarrierError:  # the other one waits for this device to be found
                pass
            return s

        probe = gs.EngineSockets()
        listener = probe.open_device(create)
        found[i] = (probe.listener, listener.getsockname()[1])
        listener.close()

    threads = [threading.Thread(target=build, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (listener, port) in found.items():
        assert listener is not None and listener.endswith(f":{port:04X}"), (i, found)
