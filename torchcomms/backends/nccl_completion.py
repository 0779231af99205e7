"""Completion of stream-ordered engine work without blocking the host.

A CUDA op is done when its end event has passed on the GPU. Nothing wakes a Python thread
then, so one poller thread per engine asks each pending op (``c10d.Work.is_completed``, an
event query plus NCCL's asynchronous-error check) every fraction of a millisecond, backing off
while nothing completes, and runs the op's callback on completion. Callers never block:
``TorchWork.wait()`` makes the current stream wait on the op instead (``stream_wait``), and the
communicator's watchdog ends an op whose deadline passes whatever the GPU does.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from torchcomms.backends.base import DoneCallback, EngineHandle

#: first and longest pause between two polls while ops are pending (seconds)
POLL_MIN_S = 0.0002
POLL_MAX_S = 0.002


class EngineFailed(RuntimeError):
    """The engine reported an asynchronous error (NCCL's ``ncclCommGetAsyncError``)."""


class CompletionPoller:
    """Polls pending engine works on a daemon thread; started on first use, ended by
    :meth:`stop` (pending callbacks are then dropped: the communicator failed those ops)."""

    def __init__(self, name: str, engine_error: Callable[[], str | None]) -> None:
        self._name = name
        self._engine_error = engine_error  # None while the engine is healthy, else why not
        self._cond = threading.Condition()
        self._pending: list[tuple[Any, DoneCallback]] = []
        self._thread: threading.Thread | None = None
        self._stopped = False

    def add(self, work: Any, callback: DoneCallback) -> None:
        with self._cond:
            if self._stopped:
                callback(EngineFailed(f"engine of {self._name!r} was shut down"))
                return
            self._pending.append((work, callback))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"torchcomms-nccl-poll-{self._name}",
                                                daemon=True)
                self._thread.start()
            elif len(self._pending) == 1:
                self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def drain(self, deadline: float) -> bool:
        """Wait (host) until nothing is pending or ``deadline`` (``time.monotonic()``) passes."""
        while time.monotonic() < deadline:
            if not self.pending():
                return True
            time.sleep(POLL_MAX_S)
        return not self.pending()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._pending = []
            self._cond.notify_all()

    def _loop(self) -> None:
        pause = POLL_MIN_S
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                    pause = POLL_MIN_S
                if self._stopped:
                    return
                batch = list(self._pending)
            done: list[tuple[Any, DoneCallback, BaseException | None]] = []
            why = self._engine_error()
            if why is not None:  # the communicator failed: every pending op fails with it
                done = [(w, cb, EngineFailed(why)) for w, cb in batch]
            else:
                for work, cb in batch:
                    try:
                        if work.is_completed():
                            done.append((work, cb, None))
                    except BaseException as e:  # noqa: BLE001 - the engine may throw anything
                        done.append((work, cb, e))
            if done:
                finished = {id(w) for w, _, _ in done}
                with self._cond:
                    self._pending = [p for p in self._pending if id(p[0]) not in finished]
                for _, cb, err in done:
                    try:
                        cb(err)
                    except Exception:  # noqa: BLE001 - a callback must not end the poller
                        pass
                pause = POLL_MIN_S
            else:
                pause = min(POLL_MAX_S, pause * 2)
            time.sleep(pause)


class StreamOrderedHandle(EngineHandle):
    """An engine op whose completion the poller reports and that callers wait for by making
    their current stream wait on it (``stream_wait``), never the host."""

    __slots__ = ("_work", "_poller", "stream_wait")

    def __init__(self, work: Any, poller: CompletionPoller) -> None:
        super().__init__(None, None)
        self._pending = 1  # not immediate: the op runs on the GPU
        self._work = work
        self._poller = poller
        self.stream_wait: Callable[[], None] = work.wait  # c10d NCCL: the current stream waits, the host does not

    def on_done(self, callback: DoneCallback) -> None:
        self._poller.add(self._work, callback)
