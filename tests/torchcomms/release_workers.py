"""Rank code of the buffer-release tests: what a completed op still holds, counted by c10's CPU
allocator (every allocation and free, on every thread)."""
from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

import torchcomms
from benchmarks.alloc_peak import allocated_now, count_allocations
from torchcomms import ReduceOp

MIB = 1 << 20


def _held_after(base: int, limit_s: float = 10.0) -> int:
    """Bytes still allocated above ``base`` once the engine's threads let go of a completed op
    (polled: they release it just after completing it), or after ``limit_s`` if they never do."""
    end = time.monotonic() + limit_s
    while True:
        held = allocated_now() - base
        if held <= 0 or time.monotonic() >= end:
            return held
        time.sleep(0.01)


def completed_async_ops_hold_nothing(numel: int = 2 * MIB) -> dict[str, Any]:
    """An async reduce-scatter and all-gather, waited for, then every reference of the caller
    dropped: the bytes each op still holds (its input, output and the engine's copies). Then a
    send and a receive each way, and whether the engine and its p2p helper threads outlived
    ``finalize()``."""
    count_allocations()
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="release")
    size = comm.get_size()

    def run(op: Callable[[torch.Tensor, torch.Tensor], Any], n_in: int, n_out: int) -> int:
        base = allocated_now()
        inp, out = torch.ones(n_in), torch.empty(n_out)
        work = op(out, inp)
        work.wait()
        del inp, out, work
        return _held_after(base)

    held = {
        "reduce_scatter_single": run(lambda o, i: comm.reduce_scatter_single(o, i, ReduceOp.SUM, async_op=True),
                                     numel, numel // size),
        "all_gather_single": run(lambda o, i: comm.all_gather_single(o, i, async_op=True), numel // size, numel),
        "all_reduce": run(lambda o, i: comm.all_reduce(i, ReduceOp.SUM, async_op=True), numel, 0),
    }
    peer = 1 - comm.get_rank()
    for sends_first in (comm.get_rank() == 0, comm.get_rank() == 1):
        if sends_first:
            comm.send(torch.ones(4), peer, async_op=False)
        else:
            comm.recv(torch.empty(4), peer, async_op=False)
    comm.barrier(async_op=False)
    engine = weakref.ref(comm.get_backend_impl())
    comm.finalize()
    gc.collect()
    held["engine_alive_after_finalize"] = engine() is not None
    end = time.monotonic() + 10
    while _p2p_threads() and time.monotonic() < end:
        time.sleep(0.01)
    held["p2p_threads_after_finalize"] = _p2p_threads()
    return held


def _p2p_threads() -> int:
    import threading

    return sum(t.name == "torchcomms-gloo-p2p" for t in threading.enumerate())
