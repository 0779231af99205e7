"""Completion of the c10d futures of one communicator's works (``Work.get_future()``).

c10d runs a future's ``then`` callbacks on the thread that completes it, and callbacks may block
on another op of the same group: PowerSGD's DDP hook all-reduces inside a callback and waits
for that all-reduce's future there. With one completion thread, that future waited behind the
callback that waited for it, and training hung at the hook's first compressed step. So a
thread that runs callbacks stops being the one that takes the queue: while every completion
thread is inside a callback, a new op's future gets a new thread, and a thread whose callbacks
returned while another took over the queue ends.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

Done = Callable[[BaseException | None], None]


class FutureCompleter:
    """Calls ``done(error or None)`` once each given work has ended (bounded by its deadline),
    from threads named ``torchcomms-c10d-futures:<comm>``."""

    def __init__(self, comm_name: str) -> None:
        self._name = f"torchcomms-c10d-futures:{comm_name}"
        self._queue: queue.SimpleQueue[tuple[Any, Done] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._free = 0  # threads waiting on the queue or on a work, not inside a callback

    def add(self, work: Any, done: Done) -> None:
        """``done`` runs once ``work`` ended: at once when it has already."""
        if work.is_completed():
            done(work.exception())
            return
        with self._lock:
            self._queue.put((work, done))
            if self._free == 0:  # no thread, or every one is inside a callback
                self._free += 1
                thread = threading.Thread(target=self._loop, daemon=True, name=self._name)
                self._threads.append(thread)
                thread.start()

    def close(self, timeout_s: float) -> None:
        """Ends every completion thread once the works queued before this call are done; waits
        for them at most ``timeout_s`` (not for the calling thread, when it is one of them)."""
        with self._lock:
            threads = list(self._threads)
            for _ in threads:
                self._queue.put(None)
        end = time.monotonic() + timeout_s
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, end - time.monotonic()))

    def _leave(self) -> None:
        self._free -= 1
        self._threads.remove(threading.current_thread())

    def _loop(self) -> None:
        """Completes queued futures in order. It keeps no reference to a completed one while it
        waits for the next: ``done`` holds c10d's future and the op's output tensors, and a
        daemon thread that let go of them only when the interpreter was finalizing did so through
        a C++ destructor that the interpreter ended with ``pthread_exit`` (SIGABRT at exit)."""
        while True:
            item = self._queue.get()
            if item is None:
                with self._lock:
                    self._leave()
                return
            work, done = item
            del item
            try:
                work.wait()
                error = None
            except BaseException as e:  # noqa: BLE001 - handed to the future, not swallowed
                error = e
            with self._lock:
                self._free -= 1
            done(error)  # runs the future's callbacks, which may wait on later futures
            del work, done, error
            with self._lock:
                self._free += 1
                if self._free > 1:  # another thread took the queue while this one was in callbacks
                    self._leave()
                    return
