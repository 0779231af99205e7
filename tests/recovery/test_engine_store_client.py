"""A shrink's engine rendezvous through a TCPStore client of its own
(``BackendContext.own_store_client``): one process, real gloo engines and a real TCPStore."""
from __future__ import annotations

import sys
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

import torchcomms
from torchcomms.backends import gloo_sockets
from torchcomms.recovery.agreement import agree_on_flag_for
from torchcomms.recovery.engines import build_until, derived_context
from torchcomms.recovery.shrink import engine_context

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _store() -> tuple[dist.TCPStore, dist.TCPStore]:
    """A TCPStore host and a client of it (a rank's store, hosted elsewhere)."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    return server, dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))


def _connected_to(port: int) -> int:
    """How many TCP connections of this host to ``port`` are established (client sides only)."""
    return sum(1 for _, remote, state in gloo_sockets._tcp_table().values()
               if remote.endswith(f":{port:04X}") and state == "01")


def test_an_abandoned_engine_build_leaves_the_communicators_store_client_to_the_agreement() -> None:
    """A shrink abandons its engine build at the deadline while gloo's rendezvous waits in a
    store call for a member that never joins, then agrees on the outcome through the
    communicator's store. A TCPStore client serves one call at a time: when the rendezvous used
    the communicator's client, the agreement's calls waited behind it, and the shrink said that
    the store did not answer instead of naming the dead rank it had waited for (2 runs of 30 of
    test_without_launcher.py's quiet shrink without a failure report)."""
    server, client = _store()
    comm = torchcomms.new_comm("gloo", "cpu", "abandoned-build", store=client)
    core = comm._core  # noqa: SLF001 - the shrink's own steps on its communicator
    keys = server.num_keys()
    # the epoch's engine over this rank and global rank 1, which never joins: its rendezvous waits for it
    ctx = engine_context(core, [0, 1], 1, time.monotonic() + 20.0)
    assert build_until(core, ctx, time.monotonic()) is None  # abandoned at once
    while server.num_keys() < keys + 2:  # it published its listener and its gloo address: now it waits
        time.sleep(0.001)
    decided = agree_on_flag_for(core.ctx.store, f"{core.ctx.store_prefix}/shrink1", 0, 0, [0], False,
                                set, time.monotonic() + 5.0)
    assert decided == (False, [0])
    comm.finalize()
    del server  # the store goes: the abandoned rendezvous ends
    for t in [t for t in threading.enumerate() if t.name == "torchcomms-build-abandoned-build"]:
        t.join(30)
        assert not t.is_alive()


def test_an_aborted_engine_with_a_store_client_of_its_own_leaves_no_connection_to_the_store() -> None:
    """An aborted gloo engine is never destroyed: its own store client's connection is shut
    down with its other connections, so each shrink (which aborts the engine it replaces) does
    not leave one more connection to the store behind."""
    server, client = _store()
    comm = torchcomms.new_comm("gloo", "cpu", "own-client", store=client)
    core = comm._core  # noqa: SLF001 - the shrink's own steps on its communicator
    before = _connected_to(server.port)
    built: dict[int, object] = {}

    def build(rank: int) -> None:  # the two members of one engine, on two threads
        ctx = derived_context(core, [0, 1], f"{core.ctx.store_prefix}/e1", 20.0, rank=rank, own_store_client=True)
        built[rank] = build_until(core, ctx, time.monotonic() + 20.0)

    threads = [threading.Thread(target=build, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engines = [built[0], built[1]]
    assert all(e is not None for e in engines)
    assert _connected_to(server.port) == before + 2  # one client of its own each
    for engine in engines:
        engine.abort()  # type: ignore[attr-defined]
    assert _connected_to(server.port) == before
    comm.finalize()
