"""Rank targets for the runner's own test (``tests/torchcomms/test_rank_runner.py``)."""
from __future__ import annotations

import os
import threading
import time

#: the process that imported this module: a zygote that preloaded it, or the rank itself
IMPORTED_BY = os.getpid()


def rank0_returns_others_block() -> int:
    """Rank 0 returns; every other rank blocks in a named function until it is killed."""
    if os.environ["TORCHCOMM_RANK"] == "0":
        return 0
    return _blocked_forever()


def rank0_raises_others_block() -> int:
    """Rank 0 fails at once; every other rank blocks (as a peer waiting on rank 0 would)."""
    if os.environ["TORCHCOMM_RANK"] == "0":
        raise RuntimeError("rank 0 gave up")
    return _blocked_forever()


def imports_from_pythonpath(module: str) -> str:
    """Import a module that only the parent's ``PYTHONPATH`` can find; return its file."""
    import importlib

    return importlib.import_module(module).__file__


def _blocked_forever() -> int:
    threading.Event().wait()  # never set
    time.sleep(3600)
    return 1


def describe_process() -> dict:
    """What a forked rank must look like to its test: its own session, its own environment,
    the torch route as the environment asked for it at import, Python's SIGPIPE disposition,
    the CPUs it may run on."""
    import os
    import signal

    import torch.distributed.distributed_c10d as c10d

    return {"pid": os.getpid(), "session": os.getsid(0), "rank": os.environ["TORCHCOMM_RANK"],
            "route_env": os.environ.get("TORCH_DISTRIBUTED_USE_TORCHCOMMS"),
            "route_on": c10d._use_torchcomms_enabled(),
            "sigpipe_ignored": signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,
            "cpus": sorted(os.sched_getaffinity(0))}


def kills_itself() -> int:
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    return 0


def waits_for_file(path: str) -> int:
    """Returns once ``path`` exists."""
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.01)
    return 0


def intra_op_threads() -> int:
    """torch's intra-op thread count in this rank."""
    import torch

    return torch.get_num_threads()


def importer() -> dict[str, int]:
    """The pid of the process that imported this module, and this rank's own."""
    return {"imported_by": IMPORTED_BY, "pid": os.getpid()}
