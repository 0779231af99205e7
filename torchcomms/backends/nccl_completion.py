"""Completion of stream-ordered engine work without blocking the host.

A CUDA op is done when its end event has passed on the GPU. Nothing wakes a Python thread
then, so one poller thread per engine asks the pending ops (``c10d.Work.is_completed``, an
event query) and runs each op's callback once it completed. Callers never block:
``TorchWork.wait()`` makes the current stream wait on the op instead (``stream_wait``), and the
communicator's watchdog ends an op whose deadline passes whatever the GPU does.

The poller is lazy, as c10d's own watchdog is (it looks every 100 ms): while ops are pending
and nobody waits on the host it polls every ``POLL_LAZY_MIN_S``, backing off to
``POLL_LAZY_MAX_S`` while none completes, and retires every completed op of a poll in one go.
Each wake of a Python thread takes the GIL from the thread issuing ops, so polling per op (every
fraction of a millisecond) made the issuing thread wait for the poller at every engine call.
A host thread that blocks on an op (``wait_blocking``, ``is_completed`` in a loop, ``finalize``,
the collective check) calls :meth:`CompletionPoller.urge`: the poller then polls every
``POLL_URGENT_MIN_S`` (backing off to ``POLL_URGENT_MAX_S``) until nothing is pending.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from torchcomms.backends.base import DoneCallback, EngineHandle

#: pause between two polls while ops are pending and nobody waits on the host (seconds); it
#: doubles after each poll that saw nothing complete, up to the maximum
POLL_LAZY_MIN_S = 0.002
POLL_LAZY_MAX_S = 0.01
#: the same while a host thread waits on an op
POLL_URGENT_MIN_S = 0.0001
POLL_URGENT_MAX_S = 0.001
#: with nothing pending the poller keeps looking every ``POLL_LAZY_MAX_S`` for this long (so
#: that ``add`` need not wake it: an op stream of a training loop never does), then sleeps until
#: an ``add`` wakes it, looking every ``IDLE_WAIT_S`` whether it was stopped
QUIET_LOOK_S = 0.2
IDLE_WAIT_S = 0.5


class EngineFailed(RuntimeError):
    """The engine reported an asynchronous error (NCCL's ``ncclCommGetAsyncError``)."""


class CompletionPoller:
    """Polls pending engine works on a daemon thread; started on first use, ended by
    :meth:`stop` (pending callbacks are then dropped: the communicator failed those ops).

    Ops issued to one NCCL stream complete in issue order, so each poll asks only the oldest
    pending ops, up to the first still running; every ``FULL_SCAN_S`` it asks all of them
    (point-to-point ops run on other streams and may complete out of order) and the engine's
    asynchronous error. ``add`` takes no lock: it is on every op's dispatch path."""

    FULL_SCAN_S = 0.01

    def __init__(self, name: str, engine_error: Callable[[], str | None]) -> None:
        self._name = name
        self._engine_error = engine_error  # None while the engine is healthy, else why not
        self._wake = threading.Event()
        self._start_lock = threading.Lock()
        self._pending: deque[tuple[Any, DoneCallback]] = deque()
        self._thread: threading.Thread | None = None
        self._idle = False
        self._urgent = False
        self._stopped = False

    def add(self, work: Any, callback: DoneCallback) -> None:
        if self._stopped:
            callback(EngineFailed(f"engine of {self._name!r} was shut down"))
            return
        self._pending.append((work, callback))  # atomic; read by the poller thread
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, daemon=True,
                                                    name=f"torchcomms-nccl-poll-{self._name}")
                    self._thread.start()
        elif self._idle:
            self._wake.set()

    def urge(self) -> None:
        """A host thread waits on a pending op: poll at the urgent pace until nothing is pending."""
        if not self._urgent:
            self._urgent = True
            self._wake.set()

    def pending(self) -> int:
        return len(self._pending)

    def drain(self, deadline: float) -> bool:
        """Wait (host) until nothing is pending or ``deadline`` (``time.monotonic()``) passes."""
        self.urge()
        while time.monotonic() < deadline:
            if not self._pending:
                return True
            time.sleep(POLL_URGENT_MAX_S)
        return not self._pending

    def stop(self, join_s: float = 0.0) -> None:
        """Stop polling (pending callbacks are dropped); wait up to ``join_s`` for the thread
        to leave its loop, so that it is no longer inside an engine call."""
        self._stopped = True
        self._pending.clear()
        self._wake.set()
        thread = self._thread
        if join_s > 0 and thread is not None and thread is not threading.current_thread():
            thread.join(join_s)

    def _loop(self) -> None:
        backoff = 1.0  # the pause's multiple of its minimum: doubles after each poll that saw nothing end
        last_scan = quiet_since = time.monotonic()
        wake = self._wake
        while not self._stopped:
            wake.clear()  # before looking: a later add() or urge() sets it again
            if not self._pending:
                self._urgent = False
                backoff = 1.0
                if time.monotonic() - quiet_since < QUIET_LOOK_S:
                    wake.wait(POLL_LAZY_MAX_S)
                    continue
                self._idle = True  # from now on add() wakes the thread
                if not self._pending:
                    wake.wait(IDLE_WAIT_S)
                self._idle = False
                continue
            quiet_since = time.monotonic()
            progressed = self._poll_head()
            if self._pending and time.monotonic() - last_scan >= self.FULL_SCAN_S:
                last_scan = time.monotonic()
                progressed = self._poll_all() or progressed
            if not self._pending:
                continue
            backoff = 1.0 if progressed else min(64.0, backoff * 2)
            if self._urgent:
                wake.wait(min(POLL_URGENT_MAX_S, POLL_URGENT_MIN_S * backoff))
            else:
                wake.wait(min(POLL_LAZY_MAX_S, POLL_LAZY_MIN_S * backoff))

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
            try:
                pending.popleft()
            except IndexError:  # cleared by a concurrent stop()
                break
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


class CurrentStreamWork:
    """Stands in for the c10d work of a synchronous op for which c10d returned none, as it may
    for an op it issued on the caller's current stream (torch.distributed's own ``all_reduce``
    allows for it: "the backend has sync'ed at CPP level"). Seen on the H200 with torch 2.11:
    synchronous all_reduces of one-rank communicators, on an idle host and an oversubscribed one.
    An event recorded on that stream right after the op marks the op's end; ``start``, an event
    recorded with timing just before the op (a timed op's), makes the two its device time.

    The events are ``torch.Event``s recorded on (and waited for by) the current stream of the
    op's device, ``torch.accelerator.current_stream(index)``, found in C++:
    ``torch.cuda.Event.record()`` builds a Python ``torch.cuda.Stream`` per call (6-8 us on the
    H200 host), and a ``torch.Event`` recorded without a stream takes the current *device*'s,
    which is not the op's in a process that drives several GPUs."""

    __slots__ = ("_event", "_start", "_index")

    def __init__(self, device: torch.device, start: torch.Event | None = None) -> None:  # noqa: D107
        self._start = start
        self._index = index = device.index
        self._event = torch.Event(device, enable_timing=start is not None)
        self._event.record(torch.accelerator.current_stream(index))  # where the op was issued

    def is_completed(self) -> bool:
        return bool(self._event.query())

    def wait(self) -> None:
        torch.accelerator.current_stream(self._index).wait_event(self._event)

    def _get_duration(self) -> float:
        """Milliseconds from ``start`` to the op's end (c10d ``Work._get_duration``'s meaning)."""
        if self._start is None:
            raise RuntimeError("c10d returned no work for this op and no start event was recorded")
        return float(self._start.elapsed_time(self._event))


class StreamOrderedHandle(EngineHandle):
    """An engine op whose completion the poller reports and that callers wait for by making
    their current stream wait on it (``stream_wait``), never the host.

    ``timed``: the engine records a start event for the op (c10d's collectives timing), so
    :meth:`device_duration_ms` reads the op's device time once it completed.

    Made on every op's dispatch path, so it sets only its own three slots: what dispatch asks of
    an ``EngineHandle`` is constant here (the op is pending on the GPU, with no future to make and
    no wait inside the engine), class attributes in place of ``EngineHandle``'s properties."""

    __slots__ = ("_work", "_poller", "_timed")

    stream_ordered = True
    is_immediate = False  # type: ignore[assignment]
    succeeded_in_call = False  # type: ignore[assignment]
    can_wait_in_engine = False  # type: ignore[assignment]

    def __init__(self, work: Any, poller: CompletionPoller, timed: bool = False) -> None:  # noqa: D107
        self._work = work
        self._poller = poller
        self._timed = timed

    def stream_wait(self) -> None:
        """c10d NCCL's ``Work.wait()``: the current stream waits on the op's end event; the
        host does not."""
        self._work.wait()

    def urge(self) -> None:
        self._poller.urge()

    def device_duration_ms(self) -> float | None:
        """Milliseconds between the op's start and end events (``Work._get_duration``); ``None``
        without timing. Call once the op completed: the end event has passed, nothing blocks."""
        if not self._timed:
            return None
        try:
            return float(self._work._get_duration())
        except Exception:  # noqa: BLE001 - no start event (timing off in the engine) or not completed
            return None

    def on_done(self, callback: DoneCallback) -> None:
        self._poller.add(self._work, callback)

    def wait_engine(self, timeout_s: float) -> tuple[bool, BaseException | None]:
        raise TypeError("a stream-ordered op is not waited for inside the engine (can_wait_in_engine is False)")

    def wait_until(self, deadline: float) -> BaseException | None:
        """Block until the op ends (its error, or ``None``) or ``deadline`` (``time.monotonic()``)
        passes (``TimeoutError``; the op goes on); the poller is urged meanwhile."""
        self._poller.urge()
        return self.wait_callback_until(deadline)
