"""The agent's watcher: a small process that ends what the workers started when the agent dies
without ending it itself (SIGKILL: the OOM killer, ``kill -9``, a scheduler's hard kill).

The workers die with the agent (``PR_SET_PDEATHSIG``), but what they started (a data loader's
workers, a program, a daemon in a session of its own) would run on under init. The agent starts
this program (``python -I -S watcher.py MARK``, in a session of its own; it imports only the
standard library: no torch, no package) with the read end of a pipe as its stdin, and tells it
the pid of each worker it starts (``+PID``) and of each worker it has ended with its group
(``-PID``), and the folder to remove should it die (``@PATH``: its run folder, which holds the
job's secret). ``exit`` means the agent is exiting normally: the watcher ends, killing nothing.
The pipe closing without it means the agent died: the watcher then SIGKILLs, pass after pass until
a pass finds none it has not killed (at most ``KILL_FOR_S``), every process of the job, and
removes that folder:

- every process whose environment holds ``TORCHCOMM_AGENT_MARK=MARK`` (the agent sets it in
  each worker's, and it is inherited by whatever a worker starts, even a daemon in a session
  of its own);
- every member of a worker's process group (also those started with an environment of their
  own), unless the worker's pid now names another process (its start time differs);
- every descendant of those, and every member of a process group or session one of them leads.

Out of reach: a process that left the worker's process group *and* does not carry the mark
(started with an environment of its own, or one that overwrote its environment's memory, as
``setproctitle`` may) once its parent chain to a process of the job is broken; a process of
another user (a setuid program); a process in another PID namespace (a container).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["MARK_VAR", "Proc", "read_procs", "job_targets", "end_job", "main"]

#: the environment variable that marks the processes of one agent's workers
MARK_VAR = "TORCHCOMM_AGENT_MARK"
#: how long the watcher keeps killing what the job's processes fork while it kills them
KILL_FOR_S = 5.0
#: the signals the watcher ignores: its life is the pipe's (a terminal's Ctrl-C, a hangup, a
#: scheduler's SIGTERM to every process of the job, a stack-dump request must not end it first)
_IGNORED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGTSTP")


@dataclass(frozen=True)
class Proc:
    """One process as ``/proc/<pid>/stat`` and ``/proc/<pid>/environ`` show it."""

    pid: int
    ppid: int
    pgrp: int
    session: int
    start: int  # clock ticks after boot
    zombie: bool
    marked: bool  # its environment holds the job's mark


def _stat(pid: int) -> tuple[str, list[str]] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode("ascii", "replace"), [x.decode("ascii", "replace") for x in fields]


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks after boot); None when it is gone."""
    stat = _stat(pid)
    try:
        return int(stat[1][19]) if stat else None
    except (IndexError, ValueError):
        return None


def _marked(pid: int, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return mark in f.read().split(b"\0")
    except OSError:  # gone, or another user's
        return False


def read_procs(mark: str) -> dict[int, Proc]:
    """Every process of this host now (best effort: processes come and go while it is read)."""
    entry = f"{MARK_VAR}={mark}".encode()
    procs: dict[int, Proc] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return procs
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        stat = _stat(pid)
        if stat is None:
            continue
        state, f = stat
        try:
            procs[pid] = Proc(pid=pid, ppid=int(f[1]), pgrp=int(f[2]), session=int(f[3]), start=int(f[19]),
                              zombie=state in ("Z", "X"), marked=_marked(pid, entry))
        except (IndexError, ValueError):
            continue
    return procs


def job_targets(procs: Mapping[int, Proc], groups: Mapping[int, int | None], spare: Iterable[int] = ()) -> set[int]:
    """The pids of the job among ``procs``: the marked ones; the members of each worker's group
    in ``groups`` (pid -> its start time, None if unknown), unless a process of that pid started
    at another time (the number was reused) or, its start time unknown, does not carry the mark;
    and, repeatedly, the children of those and the members of the groups and sessions they
    lead. Never a pid of ``spare``, pid 1 or a zombie."""
    chosen = {p.pid for p in procs.values() if p.marked}
    for pgid, start in groups.items():
        leader = procs.get(pgid)
        if leader is not None and not leader.marked and leader.start != start:
            continue
        chosen |= {p.pid for p in procs.values() if p.pgrp == pgid}
    grew = True
    while grew:
        more = {p.pid for p in procs.values()
                if p.pid not in chosen and (p.ppid in chosen or p.pgrp in chosen or p.session in chosen)}
        chosen |= more
        grew = bool(more)
    excluded = {1, *spare}
    return {pid for pid in chosen if pid not in excluded and not procs[pid].zombie}


def end_job(mark: str, groups: Mapping[int, int | None], kill_for: float = KILL_FOR_S) -> list[int]:
    """SIGKILL the job's processes (:func:`job_targets`) until a pass finds none it has not
    signalled yet (what they forked before they died) or ``kill_for`` seconds passed; the pids
    killed."""
    killed: list[int] = []
    tried: set[int] = set()
    deadline = time.monotonic() + kill_for
    me = os.getpid()
    while True:
        new = sorted(job_targets(read_procs(mark), groups, spare=(me,)) - tried)
        for pid in new:
            tried.add(pid)
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        if not new or time.monotonic() >= deadline:
            return killed
        time.sleep(0.02)


def _lines(fd: int) -> Iterable[str]:
    """The lines read from ``fd`` until it closes."""
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except InterruptedError:
            continue
        if not chunk:
            return
        pending += chunk
        *done, pending = pending.split(b"\n")
        for line in done:
            yield line.decode("ascii", "replace").strip()


def main(argv: list[str]) -> int:
    """``watcher.py MARK``: watch the agent through stdin (see the module docstring)."""
    if len(argv) != 1 or not argv[0]:
        print("usage: watcher.py MARK (stdin: the agent's pipe)", file=sys.stderr)
        return 2
    for name in _IGNORED:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    mark, agent = argv[0], os.getppid()
    groups: dict[int, int | None] = {}
    folder = ""
    for line in _lines(0):
        if line == "exit":
            return 0
        if line.startswith("@"):
            folder = line[1:]
            continue
        if line[:1] in ("+", "-") and line[1:].isdigit():
            pid = int(line[1:])
            if line[0] == "+":
                groups[pid] = start_time(pid)
            else:
                groups.pop(pid, None)
    # the pipe closed without "exit": the agent died
    killed = end_job(mark, groups)
    if folder:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    if killed:
        shown = ", ".join(map(str, killed[:20])) + (", ..." if len(killed) > 20 else "")
        print(f"[torchcomms-run watcher] the agent (pid {agent}) died without stopping its workers: killed "
              f"{len(killed)} process(es) of its job (pids {shown})", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
