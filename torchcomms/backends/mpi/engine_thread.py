"""A communicator's engine thread: its collectives run there as blocking MPI calls, in order.

MPI's blocking collectives use the library's tuned algorithms (shared-memory and tuned
components); its nonblocking ones (``libnbc`` in Open MPI) move one step per ``MPI_Test``
and measured several times slower here, small messages most. So by default a collective is
the blocking call made on this thread, and the caller waits for the thread's job in slices
(``wait(seconds)``), never past the op's deadline. A collective blocked on a failed peer is
released by revoking the communicator (ULFM); without ULFM the thread stays blocked and is
abandoned with its communicator (its later jobs are failed, never run).
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

OnError = Callable[[BaseException], BaseException]


class Job:
    """One blocking call for the engine thread; ``wait``/``future`` report its end."""

    __slots__ = ("call", "keep", "_done", "_error", "_future", "_lock")

    def __init__(self, call: Callable[[], Any], keep: Any) -> None:
        self.call = call
        self.keep = keep  # the buffers the call reads or writes
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._future: torch.futures.Future | None = None
        self._lock = threading.Lock()

    def wait(self, timeout_s: float) -> bool:
        """A ``BlockingWait``: True once the call returned (raises its error), False if it still runs."""
        if not self._done.wait(timeout_s):
            return False
        if self._error is not None:
            raise self._error
        return True

    def future(self) -> torch.futures.Future:
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._done.is_set():
                    self._complete_future()
            return self._future

    def end(self, error: BaseException | None) -> None:
        with self._lock:
            self._error = error
            self._done.set()
            if self._future is not None:
                self._complete_future()

    def _complete_future(self) -> None:
        assert self._future is not None
        if self._error is None:
            self._future.set_result(None)
        else:
            self._future.set_exception(self._error)


class EngineThread:
    """Runs a communicator's jobs one after another (MPI needs its collectives in order)."""

    def __init__(self, name: str, on_error: OnError, mpi_exception: type) -> None:
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._on_error = on_error
        self._mpi_exception = mpi_exception
        self._failed: BaseException | None = None
        self._running = False
        self._thread = threading.Thread(target=self._loop, name=f"torchcomms-mpi-{name}", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], Any], keep: Any = None) -> Job:
        job = Job(call, keep)
        self._jobs.put(job)
        return job

    def stop(self, failure: BaseException | None = None) -> None:
        """End the thread after the jobs queued so far; with ``failure`` they are failed with it
        instead of run. Never blocks."""
        if failure is not None:
            self._failed = failure
        self._jobs.put(None)

    def busy(self) -> bool:
        """True while a job's call is running (possibly blocked on a peer)."""
        return self._running

    def join(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) for the thread to end after :meth:`stop`; True if it did."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if self._failed is not None:
                job.end(self._failed)
                continue
            self._running = True
            try:
                job.call()
            except self._mpi_exception as e:
                job.end(self._on_error(e))
            except Exception as e:  # noqa: BLE001 - e.g. a failed user-defined reduction
                job.end(e)
            else:
                job.end(None)
            finally:
                self._running = False
