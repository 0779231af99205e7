"""Run a function over many inputs in worker processes, results in input order, each input's
CPU time and memory optionally bounded by the kernel.

The viewer parses one dump per rank; at 1,024 ranks that is seconds of CPU per core, so the
files are spread over one process per usable CPU. Workers are forked (the parent holds nothing
big yet), take one input at a time with a few more queued (so they do not wait for a caller that
a busy machine schedules late), and return what they made by pickle; an exception in a worker is raised in the caller when its
input's turn comes, so the first bad input in order is the one reported.

A forked worker never collects, finalizes or even traverses an object it inherited: the caller
forks with its cyclic garbage collector off and the worker freezes every object it holds
(``gc.freeze``) before it turns the collector on. The caller may hold objects, and garbage, that
only work in the process and with the threads that made them (native handles of communicators,
stores, thread pools); in a suite run a worker died of SIGSEGV inside the collector, in a full
collection (which, unlike the young ones, goes over what the worker inherited). A worker that dies
of a signal ``faulthandler`` catches (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL) leaves its
traceback in a file the caller reads: :class:`WorkerDied` says in which function it died.

With ``limits``, every input runs in a worker, even a single one, under ``RLIMIT_CPU`` (the
CPU time the worker has used so far plus the input's budget) and ``RLIMIT_AS`` (its address
space so far plus the input's budget): an input that runs for ever inside C, where no Python
signal handler runs (``pickle.load`` of a hostile file), is ended by the kernel's SIGXCPU, and
one that allocates without end gets a ``MemoryError`` rather than the machine's OOM killer;
an answer larger, pickled, than the input's bound is not sent (:class:`AnswerTooLarge`), so the
caller never holds more than the sum of the bounds.
The budget is CPU time, not wall time, so a machine saturated by other work slows a worker
without making a sound input miss it. A worker that dies is reported as :class:`WorkerDied`
at its input's turn, which ends the map as any error does. Without ``resource``
(not POSIX) the inputs run in workers unbounded.

A map that ends early (an error, or the caller stops iterating) hands out no more inputs, and
each worker finishes the input it is running and starts no other: a worker is never killed in
the middle of an input (``multiprocessing.Pool.terminate`` did, and could leave a result half-written into the
pool's pipe or a pipe lock held; the viewer's load once stalled 131 s stopping its pool).
"""
from __future__ import annotations

import faulthandler
import gc
import math
import multiprocessing as mp
import os
import re
import signal
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler as _ForkingPickler
from typing import Any, TypeVar

try:
    import resource
except ImportError:  # not POSIX: no kernel bounds
    resource = None  # type: ignore[assignment]

__all__ = ["AnswerTooLarge", "Limits", "WorkerDied", "usable_cpus", "worker_count", "ordered_map"]

_T = TypeVar("_T")
_R = TypeVar("_R")

#: fewer inputs than this are run in one process (a pool would cost more than it saves)
MIN_PARALLEL = 8
#: workers by default at most (each holds ~35 MiB resident while it parses a 2,048-entry dump;
#: more processes than this rarely help a job of dumps that the caller must then join)
MAX_DEFAULT_WORKERS = 8
#: inputs handed to a worker at a time: the one it runs and those it takes next
QUEUED = 4
#: bytes of a dead worker's faulthandler report read back (a report names at most 100 frames)
FAULT_REPORT_BYTES = 64 << 10
_FRAME_RE = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')
_OK, _ERROR, _TOO_LARGE = "ok", "error", "too large"  # how a worker's answer went


@dataclass(frozen=True)
class Limits:
    """What one input may cost its worker: CPU seconds, bytes of address space past what the
    worker held before it, and bytes of its answer, pickled (``None``: not bounded)."""

    cpu_s: int
    memory_bytes: int | None = None
    answer_bytes: int | None = None


class WorkerDied(Exception):
    """The worker running ``item`` ended before it answered: the kernel's SIGXCPU at the
    input's CPU limit, or another death (``exitcode``: minus the signal, as ``Process`` has it).
    ``fault`` is the worker's ``faulthandler`` report where it made one (a crash), ``where`` the
    place that report names in words (:func:`crash_site`)."""

    def __init__(self, item: Any, exitcode: int | None, limits: Limits | None, fault: str = "") -> None:
        self.item, self.exitcode, self.limits, self.fault = item, exitcode, limits, fault
        self.where = crash_site(fault)
        where = f" {self.where}" if self.where else ""
        super().__init__(f"the worker process running it {describe_exit(exitcode)}{where}")

    @property
    def out_of_cpu(self) -> bool:
        """Whether the kernel ended it at the input's CPU limit."""
        return hasattr(signal, "SIGXCPU") and self.exitcode == -signal.SIGXCPU


class AnswerTooLarge(Exception):
    """The answer for ``item`` took ``size`` bytes pickled, past its ``limits.answer_bytes``."""

    def __init__(self, item: Any, size: int, limits: Limits) -> None:
        self.item, self.size, self.limits = item, size, limits
        super().__init__(f"its answer takes {size} bytes, more than {limits.answer_bytes}")


def describe_exit(exitcode: int | None) -> str:
    """How a worker ended, in words."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


def crash_site(report: str) -> str | None:
    """Where a ``faulthandler`` report says the crashed thread was, in words: ``in fn
    (file.py:line)``, after ``while garbage-collecting`` when the collector ran; None when the
    report names no frame."""
    lines = report.splitlines()
    start = next((k for k, line in enumerate(lines) if line.startswith("Current thread")), None)
    if start is None:
        return None
    collecting = False
    for line in lines[start + 1:]:
        if line.strip() == "Garbage-collecting":
            collecting = True
            continue
        m = _FRAME_RE.match(line)
        if m is None:
            return None
        path, lineno, name = m.groups()
        gc_words = "while garbage-collecting " if collecting else ""
        return f"{gc_words}in {name} ({os.path.basename(path)}:{lineno})"
    return None


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_count(workers: int | None, items: int) -> int:
    """Workers for ``items`` inputs: ``workers``, or one per usable CPU (at most
    :data:`MAX_DEFAULT_WORKERS`); one for fewer than :data:`MIN_PARALLEL` inputs."""
    n = min(usable_cpus(), MAX_DEFAULT_WORKERS) if workers is None else workers
    return max(1, min(n, items)) if items >= MIN_PARALLEL else 1


def ordered_map(fn: Callable[[_T], _R], items: Sequence[_T], workers: int | None = None, *,
                limits: Callable[[_T], Limits] | None = None) -> Iterator[_R]:
    """``fn(item)`` for each item, in order, in :func:`worker_count` processes; without
    ``limits`` a single worker's inputs run here instead. ``limits(item)`` bounds each input
    (see the module doc); a worker that dies raises :class:`WorkerDied` at its input's turn."""
    n = worker_count(workers, len(items))
    if not items or (limits is None and n <= 1):
        yield from map(fn, items)
        return
    pool = _Pool(fn, items, limits, n)
    try:
        yield from pool.results()
    finally:
        pool.close()


@dataclass
class _Worker:
    proc: Any
    conn: Connection
    fault: Any = None  # the file its faulthandler writes to (forked workers)
    pending: deque[int] = field(default_factory=deque)
    closed: bool = False  # it could not take an input: it is handed no more (the input stays pending)

    def fault_report(self) -> str:
        """What the worker's faulthandler wrote ("" if nothing)."""
        if self.fault is None:
            return ""
        try:
            self.fault.seek(0)
            return self.fault.read(FAULT_REPORT_BYTES).decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def release(self) -> None:
        self.conn.close()
        if self.fault is not None:
            self.fault.close()


class _Pool:
    """Workers fed from one queue of input indices, in order (see the module doc)."""

    def __init__(self, fn: Callable[[Any], Any], items: Sequence[Any], limits: Callable[[Any], Limits] | None,
                 n: int) -> None:
        self.ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        self.fn, self.items, self.limits = fn, items, limits
        self.todo: deque[int] = deque(range(len(items)))
        self.done: dict[int, tuple[bool, Any]] = {}
        self.stop = self.ctx.Event()  # set: workers start no other input
        self.workers: list[_Worker] = [self._start() for _ in range(n)]

    def _start(self) -> _Worker:
        mine, theirs = self.ctx.Pipe()
        fault = _fault_file() if self.ctx.get_start_method() == "fork" else None  # a spawned one does not inherit it
        proc = self.ctx.Process(target=_serve, args=(theirs, self.fn, self.stop, fault.fileno() if fault else None),
                                daemon=True)
        collecting = gc.isenabled()
        gc.disable()  # so the worker starts with nothing to collect before it freezes what it inherited
        try:
            proc.start()
        except BaseException:
            if fault is not None:
                fault.close()
            raise
        finally:
            if collecting:
                gc.enable()
        theirs.close()
        return _Worker(proc, mine, fault)

    def _limits_of(self, item: Any) -> Limits | None:
        return self.limits(item) if self.limits is not None else None

    def _hand_out(self) -> None:
        """Inputs in order, one to each worker in turn, until each holds :data:`QUEUED`."""
        for depth in range(QUEUED):
            for w in list(self.workers):
                if not self.todo:
                    return
                if w.closed or len(w.pending) > depth:
                    continue
                i = self.todo.popleft()
                item = self.items[i]
                w.pending.append(i)
                try:
                    w.conn.send((i, item, self._limits_of(item)))
                except OSError:  # it died: ``_collect`` reads the answers it sent before, then its end
                    w.closed = True

    def results(self) -> Iterator[Any]:
        for i in range(len(self.items)):
            while i not in self.done:
                self._hand_out()  # (a worker found dead here answers for its input)
                if i not in self.done:
                    self._collect()
            ok, value = self.done.pop(i)
            if not ok:
                raise value
            yield value

    def _collect(self) -> None:
        """Wait for one or more answers (or deaths) of the workers that have inputs."""
        busy = {w.conn: w for w in self.workers if w.pending}
        if not busy:  # every input handed out is answered: waiting would never end
            raise RuntimeError("ordered_map: waiting for an input that no worker holds")
        for conn in wait(list(busy)):
            w = busy[conn]  # type: ignore[index]
            try:
                i, status, value = _ForkingPickler.loads(conn.recv_bytes())
            except (EOFError, OSError):
                self._lost(w)
                continue
            w.pending.popleft()
            if status == _TOO_LARGE:
                item = self.items[i]
                value = AnswerTooLarge(item, value, self._limits_of(item))  # type: ignore[arg-type]
            self.done[i] = (status == _OK, value)

    def _lost(self, w: _Worker) -> None:
        """``w`` died: the input it ran fails with :class:`WorkerDied`. Inputs are handed out in
        order, so every input still to hand out, and those queued behind it, come after that
        failure, which ends the map: none is handed out again."""
        w.proc.join()
        fault = w.fault_report()
        w.release()
        self.workers.remove(w)
        item = self.items[w.pending[0]]
        self.done[w.pending[0]] = (False, WorkerDied(item, w.proc.exitcode, self._limits_of(item), fault))
        self.todo.clear()

    def close(self) -> None:
        """Stop every worker once it has finished the input it runs (answers dropped)."""
        self.todo.clear()
        self.stop.set()
        for w in self.workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in self.workers:
            while True:  # read on: a worker blocked writing an answer could not see the stop
                try:
                    w.conn.recv_bytes()
                except (EOFError, OSError):
                    break
            w.proc.join()
            w.release()


def _fault_file() -> Any:
    """A file for a worker's faulthandler report, or None where none can be made (no report)."""
    try:
        return tempfile.TemporaryFile()
    except OSError:
        return None


def _serve(conn: Connection, fn: Callable[[Any], Any], stop: Any, fault_fd: int | None) -> None:
    """A worker: run each input handed over, under its limits, and answer ``(index, ok, value)``.
    Ctrl-C stops the caller, which stops its workers once their inputs are done (see ``close``).
    What it inherited is frozen, never collected (see the module doc); a crash's traceback goes
    to ``fault_fd``."""
    gc.freeze()
    gc.enable()
    if fault_fd is not None:
        faulthandler.enable(file=fault_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if resource is not None:
        signal.signal(signal.SIGXCPU, signal.SIG_DFL)  # the kernel's SIGXCPU ends the process
        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))  # and writes no core file
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None or stop.is_set():
            return
        i, item, limits = job
        if limits is not None and resource is not None:
            _bound(limits)
        try:
            answer: tuple[int, str, Any] = (i, _OK, fn(item))
        except Exception as exc:  # noqa: BLE001 - raised in the caller at this input's turn
            answer = (i, _ERROR, exc)
        try:
            data = _ForkingPickler.dumps(answer)
        except Exception as exc:  # noqa: BLE001 - an answer that does not pickle (or fit in memory)
            data = _ForkingPickler.dumps((i, _ERROR, RuntimeError(
                f"the answer could not be sent back ({type(exc).__name__}: {exc})")))
        if limits is not None and limits.answer_bytes is not None and len(data) > limits.answer_bytes:
            data = _ForkingPickler.dumps((i, _TOO_LARGE, len(data)))
        conn.send_bytes(data)


def _bound(limits: Limits) -> None:
    """Set this process's soft CPU and address-space limits ``limits`` past where it is now."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _set_soft(resource.RLIMIT_CPU, math.ceil(usage.ru_utime + usage.ru_stime) + limits.cpu_s)
    if limits.memory_bytes is not None:
        held = _address_space()
        if held is not None:
            _set_soft(resource.RLIMIT_AS, held + limits.memory_bytes)


def _set_soft(which: int, value: int) -> None:
    _, hard = resource.getrlimit(which)
    resource.setrlimit(which, (value if hard == resource.RLIM_INFINITY else min(value, hard), hard))


def _address_space() -> int | None:
    """Bytes of address space this process holds (Linux), else None."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
