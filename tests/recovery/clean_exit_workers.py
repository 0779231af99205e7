"""Rank targets whose communicator call fails with a caught timeout, after which the rank leaves
through the interpreter's normal exit (``TC_RANK_EXIT_NORMALLY=1``): see test_clean_exit.py."""
from __future__ import annotations

import atexit
import json
import os
import time
from datetime import timedelta

import torch

import torchcomms


def _caught(fn) -> dict:
    t0 = time.monotonic()
    try:
        fn()
    except torchcomms.CommError as e:
        return {"error": type(e).__name__, "elapsed": time.monotonic() - t0}
    return {"error": None}


def new_comm_alone(timeout_s: float) -> dict:
    """Rank 0 creates a 2-rank communicator that rank 1 never joins."""
    if int(os.environ["TORCHCOMM_RANK"]) != 0:
        time.sleep(timeout_s + 2)
        return {"error": None}
    return _caught(lambda: torchcomms.new_comm("gloo", "cpu", "alone", timeout=timedelta(seconds=timeout_s)))


def shrink_peer_never_builds(timeout_s: float) -> dict:
    """Both ranks check in to the shrink's survivor agreement; rank 1 then never builds the
    new engine (it checks in by hand), so rank 0's build is given up at its deadline."""
    comm = torchcomms.new_comm("gloo", "cpu", "shrinking", timeout=timedelta(seconds=30))
    comm.barrier(False)
    if comm.get_rank() == 1:
        prefix = comm._core.ctx.store_prefix
        comm._core.ctx.store.set(f"{prefix}/shrink{comm._core.epoch + 1}/in/1", b"1")
        time.sleep(timeout_s + 2)
        return {"error": None}
    return _caught(lambda: comm.shrink(timeout=timedelta(seconds=timeout_s)))


def split_names_differ(timeout_s: float) -> dict:
    """Both ranks split into [0, 1] under different names: their engines rendezvous apart and
    each build is given up at the split's deadline."""
    comm = torchcomms.new_comm("gloo", "cpu", "splitting", timeout=timedelta(seconds=30))
    comm.barrier(False)
    name = f"child{comm.get_rank()}"
    return _caught(lambda: comm.split([0, 1], name, timeout=timedelta(seconds=timeout_s)))


def op_times_out(timeout_s: float) -> dict:
    """Rank 0's all_reduce times out (rank 1 never joins it) and is left pending in gloo; the
    state of its engine after torchcomms' exit handler is written to ``exit_rank0.json``."""
    comms: list = []
    atexit.register(_engine_state_at_exit, comms)  # before the engine's: runs after its handler
    comm = torchcomms.new_comm("gloo", "cpu", "stalled", timeout=timedelta(seconds=30))
    comms.append(comm)
    comm.barrier(False)
    if comm.get_rank() == 1:
        time.sleep(timeout_s + 2)
        return {"error": None}
    t = torch.ones(1 << 16)
    return _caught(lambda: comm.all_reduce(t, torchcomms.ReduceOp.SUM, False, timeout=timedelta(seconds=timeout_s)))


def _engine_state_at_exit(comms: list) -> None:
    from torchcomms.backends.gloo import _ABANDONED

    backend = comms[0]._core.backend
    pg = backend.engine()
    state = {"undelivered": len(backend._undelivered()), "abandoned": any(p is pg for p in _ABANDONED)}
    path = os.path.join(os.environ["TC_GROUP_DIR"], f"exit_rank{comms[0].get_rank()}.json")
    with open(path, "w") as f:
        json.dump(state, f)


def ops_then_exit(ops: int) -> dict:
    """``ops`` all-reduces, each on a fresh tensor dropped as soon as it returns, then the
    interpreter's exit without finalizing: gloo's worker thread may still be letting go of the
    last op (its tensors) while the interpreter finalizes."""
    comm = torchcomms.new_comm("gloo", "cpu", "leaving", timeout=timedelta(seconds=60))
    for i in range(ops):
        comm.all_reduce(torch.full((4096,), float(i)), torchcomms.ReduceOp.SUM, False)
    return {"error": None}
