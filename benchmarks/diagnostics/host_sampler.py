"""Where a Python call spends its host time, by sampling every thread's stack.

A thread wakes every ``interval_s`` and records, for each other thread, its innermost frame
(where the time is spent: a C call shows as the Python line that made it) and the innermost
frame inside the given paths (which line of our own code led there). The autograd engine runs
backward on a thread of its own, so its frames are sampled too. Samples are taken only when the
sampler gets the GIL, so time inside C code that keeps the GIL is credited to the next
bytecode boundary: a guide to where to look, not a clock.

  from host_sampler import sample
  print(sample(lambda: step(), calls=200).table())
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import Callable


@dataclass
class Samples:
    """Per sampling round, where each thread was: its innermost frame, and its innermost frame
    inside ``paths``; shares are of the rounds (a thread's share of the wall time)."""

    innermost: collections.Counter[str] = field(default_factory=collections.Counter)
    ours: collections.Counter[str] = field(default_factory=collections.Counter)
    rounds: int = 0

    def table(self, top: int = 15) -> str:
        lines = [f"{self.rounds} sampling rounds"]
        for title, counter in (("innermost frame", self.innermost), ("innermost frame of ours", self.ours)):
            lines.append(f"  {title}:")
            for where, n in counter.most_common(top):
                lines.append(f"    {n / max(self.rounds, 1):6.1%}  {where}")
        return "\n".join(lines)


def _where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_name} ({os.path.basename(code.co_filename)}:{frame.f_lineno})"


def _ours(frame: FrameType | None, paths: tuple[str, ...]) -> str | None:
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(paths) and name != __file__:
            return _where(frame)
        frame = frame.f_back
    return None


def sample(fn: Callable[[], object], calls: int = 100, interval_s: float = 1e-4,
           paths: tuple[str, ...] | None = None) -> Samples:
    """Call ``fn`` ``calls`` times while sampling every other thread's stack."""
    if paths is None:
        paths = (os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),)  # the repository
    caller = threading.get_ident()
    result = Samples()
    done = threading.Event()

    def run() -> None:
        me = threading.get_ident()
        while not done.is_set():
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                role = "caller" if ident == caller else "other thread"
                result.innermost[f"[{role}] {_where(frame)}"] += 1
                mine = _ours(frame, paths)
                if mine is not None:
                    result.ours[f"[{role}] {mine}"] += 1
            result.rounds += 1
            time.sleep(interval_s)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(interval_s)  # let the sampler in between the caller's bytecodes
    sampler = threading.Thread(target=run, name="host-sampler", daemon=True)
    sampler.start()
    try:
        for _ in range(calls):
            fn()
    finally:
        done.set()
        sampler.join()
        sys.setswitchinterval(switch)
    return result
