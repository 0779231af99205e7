"""Rank targets for the MPI rank pool's own tests (``tests/mpi/test_rank_pool.py``)."""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from typing import Any

import torch

import torchcomms
from torchcomms import ReduceOp

#: how often this module's targets ran in this process since it was imported
CALLS = [0]


def describe(leave_marks: bool = False) -> dict[str, Any]:
    """What a target can see of the process it runs in; with ``leave_marks``, it then changes
    each of those things (finalizing its communicators: it leaves nothing the pool checks)."""
    from torchcomms.core.names import NAMES
    from torchcomms.tracing.flight_recorder import process_recorder

    CALLS[0] += 1
    recorder = process_recorder()
    out: dict[str, Any] = {
        "pid": os.getpid(), "calls": CALLS[0], "env": os.environ.get("TC_POOL_MARK"), "cwd": os.getcwd(),
        "group_dir": os.environ["TC_GROUP_DIR"], "argv": sys.argv[1:3],
        "dtype": str(torch.get_default_dtype()), "grad": torch.is_grad_enabled(), "threads": torch.get_num_threads(),
        "random": torch.rand(3).tolist(), "names": sorted(NAMES._incarnations), "recorded": recorder.size(),
        "recorded_comms": [c.name for c in recorder.comm_infos()], "sigusr1": str(signal.getsignal(signal.SIGUSR1)),
        "fr_prefix_in_group_dir": os.environ["TORCHCOMM_FR_DUMP_TEMP_FILE"].startswith(
            os.environ["TC_GROUP_DIR"]),
    }
    op_ids: list[int] = []
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "pool-probe")
    comm.register_pre_hook(lambda name, op_id, rec: op_ids.append(op_id))
    t = torch.ones(4)
    comm.all_reduce(t, ReduceOp.SUM, False)
    out.update(first_op_id=op_ids[0], sum=t[0].item())
    if leave_marks:
        os.environ["TC_POOL_MARK"] = "left by an earlier target"
        os.chdir("/")
        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(False)
        torch.set_num_threads(2)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        comm.split(list(range(comm.get_size())), "pool-probe-child").finalize()
        sys.argv.append("extra")
    comm.finalize()
    return out


def leave_a_communicator() -> int:
    """All-reduce on a communicator that is never finalized."""
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "left-open")
    comm.all_reduce(torch.ones(2), ReduceOp.SUM, False)
    return os.getpid()


def leave_a_thread() -> int:
    threading.Thread(target=time.sleep, args=(60,), name="left-running", daemon=True).start()
    return os.getpid()


def exit_with(code: int) -> int:
    """Succeeds, but the rank's exit ends with ``code`` (an exit handler)."""
    atexit.register(os._exit, code)
    return os.getpid()


def fail_on(rank: int, others_block: bool = False) -> int:
    """``rank`` raises; the others return (or block, as a peer waiting on it would)."""
    me = int(os.environ["OMPI_COMM_WORLD_RANK"])
    if me == rank:
        raise RuntimeError(f"rank {rank} gave up in the pool")
    if others_block:
        _blocked_in_a_pool_target()
    return os.getpid()


def hang() -> int:
    return _blocked_in_a_pool_target()


def _blocked_in_a_pool_target() -> int:
    threading.Event().wait()  # never set
    return 1


def pid() -> int:
    return os.getpid()


def cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))
