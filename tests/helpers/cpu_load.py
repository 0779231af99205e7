"""Oversubscribe the CPU for a bounded time: ``per_core`` busy processes on every core.

    with oversubscribed(per_core=8, limit_s=120):
        ...  # the job under test runs here, starved

Each burner exits by itself after ``limit_s`` (a crashed test leaves nothing spinning for
long) and is killed when the block ends.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

_BURN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def oversubscribed(per_core: int = 8, limit_s: float = 180.0) -> Iterator[int]:
    """Run ``per_core`` × cores busy loops until the block ends; yields how many run."""
    count = per_core * (os.cpu_count() or 1)
    procs = [subprocess.Popen([sys.executable, "-c", _BURN, str(limit_s)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(count)]
    try:
        yield count
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()
