"""Rank-side synchronisation without the library: a start line on the runner's directory."""
from __future__ import annotations

import os
import time
from pathlib import Path

#: the runner's per-group directory, exported to every rank (``RankGroup``)
GROUP_DIR_ENV = "TC_GROUP_DIR"


def start_together(timeout: float = 120.0) -> None:
    """Return once every rank of the group has called this (a file per rank in the group's
    directory), so a communicator whose timeout is shorter than the ranks' start-up skew
    (interpreter and torch import on a loaded machine) is not failed by that skew alone."""
    reach("started", timeout)


def reach(line: str, timeout: float = 120.0) -> None:
    """Return once every rank of the group has reached ``line`` (called this with it)."""
    root = Path(os.environ[GROUP_DIR_ENV])
    env = os.environ
    rank = int(env["TORCHCOMM_RANK"] if "TORCHCOMM_RANK" in env else env["OMPI_COMM_WORLD_RANK"])
    size = int(env["TORCHCOMM_SIZE"] if "TORCHCOMM_SIZE" in env else env["OMPI_COMM_WORLD_SIZE"])
    (root / f"{line}{rank}").touch()
    deadline = time.monotonic() + timeout
    while len(list(root.glob(f"{line}*"))) < size:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: the other ranks did not reach {line!r} within {timeout:g} s")
        time.sleep(0.01)
