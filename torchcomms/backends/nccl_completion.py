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
from collections import deque
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
    :meth:`stop` (pending callbacks are then dropped: the communicator failed those ops).

    Ops issued to one NCCL stream complete in issue order, so each poll asks only the oldest
    pending ops, up to the first still running; every ``FULL_SCAN_S`` it asks all of them
    (point-to-point ops run on other streams and may complete out of order). ``add`` takes no
    lock unless the poller sleeps idle: it is on every op's dispatch path."""

    FULL_SCAN_S = 0.01

    def __init__(self, name: str, engine_error: Callable[[], str | None]) -> None:
        self._name = name
        self._engine_error = engine_error  # None while the engine is healthy, else why not
        self._cond = threading.Condition()
        self._pending: deque[tuple[Any, DoneCallback]] = deque()
        self._thread: threading.Thread | None = None
        self._idle = False
        self._stopped = False

    def add(self, work: Any, callback: DoneCallback) -> None:
        if self._stopped:
            callback(EngineFailed(f"engine of {self._name!r} was shut down"))
            return
        self._pending.append((work, callback))  # atomic; read by the poller thread
        if self._thread is None:
            with self._cond:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, daemon=True,
                                                    name=f"torchcomms-nccl-poll-{self._name}")
                    self._thread.start()
        elif self._idle:
            with self._cond:
                self._cond.notify()

    def pending(self) -> int:
        return len(self._pending)

    def drain(self, deadline: float) -> bool:
        """Wait (host) until nothing is pending or ``deadline`` (``time.monotonic()``) passes."""
        while time.monotonic() < deadline:
            if not self._pending:
                return True
            time.sleep(POLL_MAX_S)
        return not self._pending

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._pending.clear()
            self._cond.notify_all()

    def _loop(self) -> None:
        pause = POLL_MIN_S
        last_scan = time.monotonic()
        while not self._stopped:
            if not self._pending:
                with self._cond:
                    self._idle = True
                    while not self._pending and not self._stopped:
                        self._cond.wait(0.05)
                    self._idle = False
                pause = POLL_MIN_S
                continue
            progressed = self._poll_head()
            if self._pending and time.monotonic() - last_scan >= self.FULL_SCAN_S:
                last_scan = time.monotonic()
                progressed = self._poll_all() or progressed
            pause = POLL_MIN_S if progressed else min(POLL_MAX_S, pause * 2)
            time.sleep(pause)

    def _poll_head(self) -> bool:
        pending = self._pending
        progressed = False
        while pending and not self._stopped:
            work, cb = pending[0]
            try:
                if not work.is_completed():
                    break
                err: BaseException | None = None
            except BaseException as e:  # noqa: BLE001 - the engine may throw anything
                err = e
            pending.popleft()
            _call(cb, err)
            progressed = True
        return progressed

    def _poll_all(self) -> bool:
        why = self._engine_error()
        if why is not None:  # the communicator failed: every pending op fails with it
            failed = list(self._pending)
            self._pending.clear()
            for _, cb in failed:
                _call(cb, EngineFailed(why))
            return True
        done = []
        for item in list(self._pending):
            try:
                if item[0].is_completed():
                    done.append((item, None))
            except BaseException as e:  # noqa: BLE001
                done.append((item, e))
        for item, err in done:
            try:
                self._pending.remove(item)
            except ValueError:  # taken by a concurrent stop()
                continue
            _call(item[1], err)
        return bool(done)


def _call(cb: DoneCallback, err: BaseException | None) -> None:
    try:
        cb(err)
    except Exception:  # noqa: BLE001 - a callback must not end the poller
        pass


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
