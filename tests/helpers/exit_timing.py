"""How long a rank's exit was blocked: the wall time of its exit that its main thread spent
neither on a CPU nor waiting for one (``/proc/thread-self/schedstat``).

On a loaded machine an exit takes long because the process waits for CPU time; a wait in the
exit's own code (a join, a socket, a lock) shows as blocked time whatever the load. ::

    timer = ExitTimer(path)   # early in the rank: its hook runs after those registered later
    ...
    timer.start()             # where the exit begins (the rank's work is done)

At the interpreter's exit the hook writes ``{"wall", "cpu", "runq", "blocked"}`` (seconds) to
``path``; nothing when this kernel has no schedstat.
"""
from __future__ import annotations

import atexit
import json
import time
from pathlib import Path

SCHEDSTAT = Path("/proc/thread-self/schedstat")


def thread_times() -> tuple[float, float, float] | None:
    """This thread's (wall clock, time on a CPU, time waiting for a CPU), in seconds; ``None``
    where the kernel has no schedstat."""
    try:
        on_cpu_ns, runq_ns, _slices = (int(x) for x in SCHEDSTAT.read_text().split())
    except (OSError, ValueError):
        return None
    return time.monotonic(), on_cpu_ns / 1e9, runq_ns / 1e9


def read_exit_timing(path: Path) -> dict[str, float] | None:
    """What an :class:`ExitTimer` wrote to ``path`` (``None``: nothing was written)."""
    return json.loads(path.read_text()) if path.exists() else None


class ExitTimer:
    """Times the exit of this process from :meth:`start` to an ``atexit`` hook registered at
    construction (hooks run last-registered first: this one after every hook registered later)."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._start: tuple[float, float, float] | None = None
        atexit.register(self._finish)

    def start(self) -> None:
        self._start = thread_times()

    def _finish(self) -> None:
        end = thread_times()
        if self._start is None or end is None:
            return
        wall, cpu, runq = (b - a for a, b in zip(self._start, end))
        self._path.write_text(json.dumps({"wall": wall, "cpu": cpu, "runq": runq, "blocked": wall - cpu - runq}))
