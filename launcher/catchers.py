"""Which processes of a worker's process group catch a signal (Linux ``/proc``).

A flight-recorder dump is asked for with SIGUSR1, whose default action ends the process: sent
to a process that installed no handler (a program that dumps nothing, a data-loader child, a
shell wrapper), it would kill it, and the job's summary would blame a signal that was never
meant to stop anything. The dump request therefore goes only to the processes that catch it.
"""

from __future__ import annotations

import os

from .procfs import processes_where

__all__ = ["catches", "group_members"]


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``sig`` (False when it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


def group_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` now (best effort: a process may come or go)."""
    return processes_where("pgrp", pgid)
