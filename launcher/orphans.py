"""What the workers leave behind: the launcher is their processes' child subreaper (Linux
``PR_SET_CHILD_SUBREAPER``), so a descendant orphaned by a worker's exit is re-parented to it,
not to init, even one that left the worker's process group (a program started in a session of
its own). When a group of workers is stopped those adopted processes are ended too, and reaped:
nothing the job started runs on after it. A SIGKILLed agent ends nothing itself: its watcher
(:mod:`launcher.watcher`) does.
"""
from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Collection

from .procfs import processes_where

__all__ = ["become_subreaper", "is_subreaper", "children", "end_adopted"]

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_libc = ctypes.CDLL(None, use_errno=True)


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants; False where the kernel cannot."""
    try:
        return _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (AttributeError, OSError):
        return False


def is_subreaper() -> bool:
    """Whether this process is a child subreaper (so its children include adopted orphans)."""
    flag = ctypes.c_int(0)
    try:
        return _libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and bool(flag.value)
    except (AttributeError, OSError):
        return False


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` now (best effort, as they come and go)."""
    return processes_where("ppid", pid)


def end_adopted(own: Collection[int], wait_s: float = 2.0) -> list[int]:
    """SIGKILL and reap this subreaper's adopted children: every child but ``own`` (the processes
    it started itself, which their owners reap), again as long as killing them orphans more, for
    at most ``wait_s``. Returns the pids ended; nothing when this process is no subreaper (its
    children are then only its own)."""
    if not is_subreaper():
        return []
    me, ended, deadline = os.getpid(), [], time.monotonic() + wait_s
    while True:
        adopted = [p for p in children(me) if p not in own]
        if not adopted or time.monotonic() >= deadline:
            return ended
        for pid in adopted:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in adopted:
            while time.monotonic() < deadline:
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere, or not ours after all
                    break
                if done:
                    ended.append(pid)
                    break
                time.sleep(0.005)
