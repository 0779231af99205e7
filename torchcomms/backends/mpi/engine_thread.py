"""A communicator's engine thread: the collectives whose nonblocking form is slow run there as
blocking MPI calls, in order.

Open MPI's nonblocking collectives (``libnbc``) move one step per ``MPI_Test``; for most ops they
keep pace with the blocking calls (see :mod:`.hints`), but not for a large reduce or a
reduce-scatter with per-rank counts, nor for the all-reduce unless libnbc's algorithm was chosen
for it. Those are the blocking call made on this thread, and the caller waits for the thread's
job in slices (``wait(seconds)``), never past the op's deadline. A blocking collective waiting
on a peer that died returns once ULFM reports the death (a revoke alone does not release it);
without ULFM, or while a stopped peer lives, the thread stays blocked and is abandoned with its
communicator (its later jobs are failed, never run).

Nonblocking collectives are started on the caller's thread when nothing of the communicator is
queued here or running (:meth:`EngineThread.start_inline`: MPI needs every rank to start a
communicator's collectives in the same order), else queued here behind the others.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from torchcomms.backends.mpi.progress import Completion

OnError = Callable[[BaseException], BaseException]
T = TypeVar("T")


class Job:
    """One blocking call for the engine thread; ``wait``/``future`` report its end.

    Its end is signalled by releasing a lock taken at creation (the cheapest wake-up CPython
    has: no condition variable, no per-wait allocation)."""

    __slots__ = ("call", "keep", "_ended", "_done", "_error", "_future", "_lock")

    def __init__(self, call: Callable[[], Any], keep: Any) -> None:
        self.call = call
        self.keep = keep  # the buffers the call reads or writes
        self._ended = threading.Lock()
        self._ended.acquire()
        self._done = False
        self._error: BaseException | None = None
        self._future: Completion | None = None
        self._lock = threading.Lock()

    def wait(self, timeout_s: float) -> bool:
        """A ``BlockingWait``: True once the call returned (raises its error), False if it still runs."""
        if not self._done:
            if not self._ended.acquire(timeout=max(timeout_s, 0.0)):
                return False
            self._ended.release()  # for the next waiter
        if self._error is not None:
            raise self._error
        return True

    def future(self) -> Completion:
        with self._lock:
            if self._future is None:
                self._future = Completion()
                if not self._done:
                    return self._future
            else:
                return self._future
        self._complete(self._future)  # ended before anyone asked
        return self._future

    def end(self, error: BaseException | None) -> None:
        with self._lock:
            self._error = error
            self._done = True
            future = self._future
        self._ended.release()
        if future is not None:
            self._complete(future)

    def _complete(self, future: Completion) -> None:
        if self._error is None:
            future.set_result(None)
        else:
            future.set_exception(self._error)


class EngineThread:
    """Runs a communicator's jobs one after another (MPI needs its collectives in order)."""

    def __init__(self, name: str, on_error: OnError, mpi_exception: type) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._jobs: deque[Job | None] = deque()
        self._on_error = on_error
        self._mpi_exception = mpi_exception
        self._failed: BaseException | None = None
        self._running = False
        self._thread = threading.Thread(target=self._loop, name=f"torchcomms-mpi-{name}", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], Any], keep: Any = None) -> Job:
        job = Job(call, keep)
        with self._cond:
            self._jobs.append(job)
            self._cond.notify()
        return job

    def start_inline(self, start: Callable[[], T]) -> tuple[bool, T | None]:
        """``(True, start())`` with ``start`` called on the caller's thread when no job is
        queued or running (so nothing of this communicator started before it is still to be
        started), else ``(False, None)`` and nothing called."""
        with self._cond:
            if self._jobs or self._running:
                return False, None
            return True, start()

    def stop(self, failure: BaseException | None = None) -> None:
        """End the thread after the jobs queued so far; with ``failure`` they are failed with it
        instead of run. Never blocks."""
        if failure is not None:
            self._failed = failure
        with self._cond:
            self._jobs.append(None)
            self._cond.notify()

    def busy(self) -> bool:
        """True while a job's call is running (possibly blocked on a peer)."""
        return self._running

    def join(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) for the thread to end after :meth:`stop`; True if it did."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while self._run_next():
            pass

    def _run_next(self) -> bool:
        """Run the next job, once there is one; False once the thread is stopped. A method, so
        that nothing of a job (its buffers) stays referenced while the thread waits for the next."""
        cond, jobs = self._cond, self._jobs
        with cond:
            while not jobs:
                cond.wait()
            job = jobs.popleft()
            if job is None:
                return False
            self._running = self._failed is None
        if self._failed is not None:
            job.end(self._failed)
            return True
        try:
            job.call()
        except self._mpi_exception as e:
            self._running = False
            job.end(self._on_error(e))
        except Exception as e:  # noqa: BLE001 - e.g. a failed user-defined reduction
            self._running = False
            job.end(e)
        else:
            # not running any more before the caller is woken: its next op may start inline
            self._running = False
            job.end(None)
        return True
