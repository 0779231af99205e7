"""Rank programs for the tracing end-to-end tests: ``python -m tests.tracing.workers SCENARIO``.

Each runs a real gloo communicator from TORCHCOMM_RANK/TORCHCOMM_SIZE and MASTER_ADDR/PORT;
dumps go to TORCHCOMM_FR_DUMP_TEMP_FILE (default tracing does it, nothing here dumps by hand).
"""
from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch

import torchcomms
from torchcomms import ReduceOp

TIMEOUT_S = float(os.environ.get("TRACE_TEST_TIMEOUT_S", "2"))


def _comm() -> torchcomms.TorchComm:
    # A generous timeout for the rendezvous (ranks of a loaded CI box start seconds apart),
    # then the short one the scenarios are about for the ops.
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "dp", timeout=timedelta(seconds=120))
    comm.set_timeout(timedelta(seconds=TIMEOUT_S))
    return comm


def skip_collective() -> int:
    """Three all_reduces everywhere; the last rank skips the third. The others time out."""
    comm = _comm()
    rank, size = comm.get_rank(), comm.get_size()
    t = torch.ones(256)
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    comm.barrier(async_op=False)
    if rank == size - 1:
        time.sleep(TIMEOUT_S + 8)  # stay connected while the others time out, then exit (atexit dump)
        return 0
    try:
        comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    except torchcomms.CommError as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    return 0


def size_mismatch() -> int:
    """Rank 0 all_reduces a [64] tensor, rank 1 an [8, 8] one (a reshape bug).

    The byte counts agree on purpose: when they differ, gloo's receiving rank dies in C++
    (``EnforceNotMet`` → ``std::terminate``) before any Python runs, so it leaves no dump.
    """
    comm = _comm()
    rank = comm.get_rank()
    comm.barrier(async_op=False)
    t = torch.ones(64) if rank == 0 else torch.ones(8, 8)
    try:
        comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    except torchcomms.CommError as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    comm.finalize()
    return 0


def byte_mismatch() -> int:
    """Rank 0 all_reduces 64 floats, rank 1 32: without the collective check gloo's receiving
    rank dies in C++; run with TORCHCOMM_CHECK_COLLECTIVES=1, both raise and dump."""
    comm = _comm()
    rank = comm.get_rank()
    comm.barrier(async_op=False)
    try:
        comm.all_reduce(torch.ones(64 if rank == 0 else 32), ReduceOp.SUM, async_op=False)
    except torchcomms.CommError as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    return 0


def timeout_then_abort() -> int:
    """The last rank skips all_reduce #2 and stays connected, so the first rank's op times out
    while gloo still blocks in it; that rank dumps (``<prefix>blocked_<rank>``), aborts the
    communicator (gloo then returns from the op) and dumps again (``<prefix>aborted_<rank>``)."""
    from torchcomms.tracing.flight_recorder import process_recorder

    comm = _comm()
    rank, size = comm.get_rank(), comm.get_size()
    t = torch.ones(256)
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    if rank == size - 1:
        time.sleep(TIMEOUT_S + 8)
        return 0
    prefix = os.environ["TORCHCOMM_FR_DUMP_TEMP_FILE"]
    try:
        comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    except torchcomms.CommTimeoutError as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
    else:
        return 1
    process_recorder().dump_file(rank, reason="blocked", prefix=f"{prefix}blocked_")
    comm.abort()
    # gloo's abort returns once the engine delivered the op's end; allow a loaded box a while
    deadline = time.monotonic() + 10
    while any(e.in_engine for e in process_recorder().entries()) and time.monotonic() < deadline:
        time.sleep(0.05)
    process_recorder().dump_file(rank, reason="aborted", prefix=f"{prefix}aborted_")
    return 3


def clean() -> int:
    """A few correct collectives, then exit (atexit dump)."""
    comm = _comm()
    t = torch.ones(1024)
    for _ in range(3):
        comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    comm.all_gather_single(torch.empty(1024 * comm.get_size()), t, async_op=False)
    comm.barrier(async_op=False)
    comm.finalize()
    return 0


if __name__ == "__main__":
    code = globals()[sys.argv[1]]()
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 3:
        os._exit(code)  # a broken gloo comm may block interpreter teardown; the dump is written
    sys.exit(code)
