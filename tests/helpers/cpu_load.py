"""Oversubscribe the CPU for a bounded time: ``per_core`` busy processes on each CPU the block
runs on.

    with oversubscribed(per_core=8, limit_s=120):
        ...  # the job under test runs here, starved

The block runs confined to ``cpus`` CPUs of this machine (the calling thread's affinity, which
every process it starts inherits: the job's ranks, its launcher, the busy loops; ranks forked by
the zygote take it too). So the job sees ``per_core`` busy processes competing with it on every
CPU it may use, whatever the machine's size, while tests running beside it on other pytest
workers keep the other CPUs: a block on every CPU starved the whole suite, and on a large
machine the blocks of several workers stacked (128 busy processes each on 16 CPUs, a load of
165) until jobs failed for a load no test meant to apply. Each worker claims free CPUs through
lock files, so concurrent blocks take different CPUs while there are enough.

Each burner exits by itself after ``limit_s`` (a crashed test leaves nothing spinning for
long) and is killed when the block ends.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

_BURN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"

#: where the per-CPU claim files live (shared by every pytest worker on the machine; a test of
#: the claims themselves points it at a folder of its own)
CLAIMS_DIR_ENV = "TC_TEST_CPU_CLAIMS_DIR"


def _worker_index() -> int:
    """This pytest-xdist worker's number (``gw3``: 3), 0 outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name[2:].isdigit() else 0


@contextlib.contextmanager
def _claimed_cpus(allowed: list[int], wanted: int) -> Iterator[set[int]]:
    """``wanted`` CPUs of ``allowed``: free ones first (an exclusive lock file each, let go when
    the block ends or this process dies), the rest shared with another block when too few are
    free. The search starts at a CPU that depends on the worker, so that workers spread."""
    claims = Path(os.environ.get(CLAIMS_DIR_ENV) or Path(tempfile.gettempdir()) / "torchcomms-tests-cpu-claims")
    claims.mkdir(exist_ok=True)
    start = _worker_index() % len(allowed)
    order = allowed[start:] + allowed[:start]
    held: list[int] = []
    chosen: list[int] = []
    try:
        for cpu in order:
            if len(chosen) == wanted:
                break
            fd = os.open(claims / f"cpu{cpu}.lock", os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held.append(fd)
            chosen.append(cpu)
        chosen += [c for c in order if c not in chosen][:wanted - len(chosen)]
        yield set(chosen)
    finally:
        for fd in held:
            os.close(fd)  # closing drops the lock


def _unpin_threads(pinned: set[int], before: set[int]) -> None:
    """Give ``before`` back to every thread of this process confined to ``pinned``: the caller,
    and the threads started in the block, which inherited its CPUs (torch's intra-op pool, a
    rank group's readers) and would otherwise stay on them for the rest of the worker's tests."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.sched_getaffinity(int(task)) == pinned:
                os.sched_setaffinity(int(task), before)


@contextlib.contextmanager
def oversubscribed(per_core: int = 8, limit_s: float = 180.0, cpus: int = 1) -> Iterator[int]:
    """Confine the block to ``cpus`` CPUs (at most those this thread may use) and run
    ``per_core`` busy loops on each until the block ends; yields how many loops run."""
    before = os.sched_getaffinity(0)
    allowed = sorted(before)
    with _claimed_cpus(allowed, max(1, min(cpus, len(allowed)))) as chosen:
        os.sched_setaffinity(0, chosen)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for _ in range(per_core * len(chosen)):  # one by one: a failed start still kills those started
                procs.append(subprocess.Popen([sys.executable, "-c", _BURN, str(limit_s)], stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            yield len(procs)
        finally:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGKILL)
            for p in procs:
                p.wait()
            _unpin_threads(chosen, before)
