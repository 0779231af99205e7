"""Is the process that hosts the control plane still running? Read from /proc, for a control
plane on this host (``TORCHCOMM_CONTROL_PID``, set by ``torchcomms-run`` for its workers).

An unanswered control plane is either starved (the node is oversubscribed, and the host
process waits for a core like every other) or gone. Time alone cannot tell them apart on a busy
node; the host's process state can: a process that is running or waiting to run is slow, one
that is stopped, a zombie or missing is lost.
"""
from __future__ import annotations

from collections.abc import Callable

#: /proc/<pid>/stat states of a process that will answer once it gets a core
_RUNNING_STATES = frozenset("RSDIW")


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after ``pid (comm)`` (the state letter first, then
    ppid, ...; utime and stime at 11 and 12); ``None`` where /proc cannot tell (the process is
    gone, or there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # after "pid (comm)": the command name may hold anything, ")" included
    return stat.rpartition(b")")[2].decode("ascii", "replace").split()


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` in ``/proc/<pid>/stat`` (``R``, ``S``, ``T``,
    ``Z``, ...); ``None`` where /proc cannot tell (the process is gone, or there is no /proc)."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def process_running(pid: int) -> bool:
    """Whether ``pid`` exists and is running or runnable (not stopped, traced or a zombie).
    Where /proc is missing, ``False`` (nothing known: the caller's time limit decides)."""
    return process_state(pid) in _RUNNING_STATES


def host_running_check(pid: int | None) -> Callable[[], bool] | None:
    """A check of the control plane's host process ``pid``; ``None`` when it is not on this host."""
    if pid is None:
        return None
    return lambda: process_running(pid)
