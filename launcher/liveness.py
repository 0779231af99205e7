"""Rank liveness on one node: tells a slow rank from a stopped or hung one.

The agent supervises its ranks' processes, so it knows more than a heartbeat can say:

- **dead**: the process exited. The waiter thread sees it at once (not judged here).
- **stopped**: the process state in ``/proc/<pid>/stat`` is ``T`` (SIGSTOP) or ``t`` (a
  debugger). Reported once it has stayed stopped for ``stopped_after`` seconds.
- **hung**: alive, not stopped, its heartbeats silent (the control server said
  ``rank_silent`` and not ``rank_heard`` since) *and* no progress for ``hung_after`` seconds.
  Progress is judged per one-second window: the process used at least ``cpu_floor`` of one
  core, or its main thread was runnable (``R``: running, or waiting for a CPU) in at least
  half the samples. A starved rank waits runnable for its share of the CPU, and a rank whose
  Python thread holds the GIL in a long C call burns CPU in it, so neither is ever judged
  hung, however late its heartbeats are; one that sleeps with the GIL held (or is deadlocked
  with every thread blocked) is hung after ``hung_after``.

The judge only reads ``/proc``; it is fed the heartbeat suspicions and asked for verdicts by
the agent's monitor loop, and each verdict is given once per rank and process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from torchcomms.control.host_process import stat_fields

__all__ = ["ProcSample", "LivenessJudge", "Verdict", "read_proc", "DEFAULT_HUNG_AFTER_S",
           "DEFAULT_STOPPED_AFTER_S", "DEFAULT_CPU_FLOOR"]

#: Seconds of heartbeat silence without CPU progress before a rank is hung. A rank that
#: sleeps holding the GIL (a blocking C call) for longer than this is taken for hung.
DEFAULT_HUNG_AFTER_S = 30.0
#: Seconds a rank may stay stopped (SIGSTOP, a debugger) before it is reported stopped.
DEFAULT_STOPPED_AFTER_S = 2.0
#: Share of one core below which a silent process makes no progress.
DEFAULT_CPU_FLOOR = 0.02
#: How often the CPU time of a silent rank is compared (progress is judged per window).
_WINDOW_S = 1.0
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcSample:
    """One reading of a process: its state letter and CPU time (user + system, seconds)."""

    state: str
    cpu_s: float


def read_proc(pid: int) -> ProcSample | None:
    """``/proc/<pid>/stat`` of a live process, or ``None`` (gone, a zombie, or no ``/proc``)."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 13 or fields[0] in ("Z", "X", "x"):
        return None
    return ProcSample(fields[0], (int(fields[11]) + int(fields[12])) / _CLK_TCK)


@dataclass(frozen=True)
class Verdict:
    """A rank found stopped or hung (``kind``); ``silent_s``: its heartbeat silence,
    ``quiet_s``: how long it made no progress (hung) or stayed stopped (stopped)."""

    rank: int
    pid: int
    kind: str  # "stopped" or "hung"
    silent_s: float
    quiet_s: float


@dataclass
class _Watched:
    pid: int
    stopped_since: float | None = None
    silent_since: float | None = None  # the last heartbeat, while the server calls it silent
    quiet_since: float = 0.0  # the last progress seen while silent
    mark: float = 0.0  # start of the current CPU window
    mark_cpu: float = 0.0
    windows: int = 0  # CPU windows measured while silent
    samples: int = 0  # samples in the current window
    runnable: int = 0  # of which the main thread was runnable
    reported: frozenset[str] = frozenset()


class LivenessJudge:
    """Verdicts on one node's ranks from their process state, CPU time and heartbeats."""

    def __init__(self, *, hung_after: float = DEFAULT_HUNG_AFTER_S,
                 stopped_after: float = DEFAULT_STOPPED_AFTER_S,
                 cpu_floor: float = DEFAULT_CPU_FLOOR,
                 sample: Callable[[int], ProcSample | None] = read_proc,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.hung_after = hung_after
        self.stopped_after = stopped_after
        self.cpu_floor = cpu_floor
        self._sample = sample
        self._clock = clock
        self._ranks: dict[int, _Watched] = {}

    def watch(self, rank: int, pid: int) -> None:
        """Judge ``rank``, run by process ``pid`` (a new process starts with a clean slate)."""
        self._ranks[rank] = _Watched(pid)

    def forget(self, rank: int) -> None:
        self._ranks.pop(rank, None)

    def silent(self, rank: int, silent_s: float, pid: int | None = None) -> None:
        """The control server reports ``rank``'s heartbeats silent for ``silent_s`` seconds
        (ignored if ``pid`` names another process: a predecessor's)."""
        w = self._ranks.get(rank)
        if w is None or (pid is not None and pid != w.pid):
            return
        now = self._clock()
        sample = self._sample(w.pid)
        w.silent_since = now - max(0.0, silent_s)
        w.quiet_since = w.silent_since
        w.mark, w.mark_cpu, w.windows = now, (sample.cpu_s if sample else 0.0), 0
        w.samples = w.runnable = 0

    def heard(self, rank: int, pid: int | None = None) -> None:
        """``rank``'s heartbeats arrive again."""
        w = self._ranks.get(rank)
        if w is not None and (pid is None or pid == w.pid):
            w.silent_since = None

    def check(self) -> list[Verdict]:
        """New verdicts (each kind at most once per rank and process)."""
        now = self._clock()
        out: list[Verdict] = []
        for rank, w in self._ranks.items():
            sample = self._sample(w.pid)
            if sample is None:
                continue  # exited: its exit is reported by its waiter
            if sample.state in ("T", "t"):
                if w.stopped_since is None:
                    w.stopped_since = now
                if w.silent_since is not None:  # stopped time is not hung time
                    w.quiet_since, w.mark, w.mark_cpu = now, now, sample.cpu_s
                stopped = now - w.stopped_since
                if stopped >= self.stopped_after and "stopped" not in w.reported:
                    w.reported |= {"stopped"}
                    silent = 0.0 if w.silent_since is None else now - w.silent_since
                    out.append(Verdict(rank, w.pid, "stopped", silent, stopped))
                continue
            w.stopped_since = None
            if w.silent_since is None:
                continue
            w.samples += 1
            w.runnable += sample.state == "R"
            if now - w.mark >= _WINDOW_S:
                if sample.cpu_s - w.mark_cpu >= self.cpu_floor * (now - w.mark) \
                        or 2 * w.runnable >= w.samples:
                    w.quiet_since = now  # it ran, or waited for a CPU: slow, not hung
                w.mark, w.mark_cpu = now, sample.cpu_s
                w.samples = w.runnable = 0
                w.windows += 1
            quiet = now - w.quiet_since
            if w.windows and quiet >= self.hung_after and "hung" not in w.reported:
                w.reported |= {"hung"}
                out.append(Verdict(rank, w.pid, "hung", now - w.silent_since, quiet))
        return out
