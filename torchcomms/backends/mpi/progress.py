"""Completion of MPI requests: polled in the caller's thread for a blocking op, by one progress
thread for async ops.

MPI's nonblocking operations move only while some thread calls into MPI, and ``MPI_Wait``
cannot be bounded, so nothing here ever waits in MPI: waits poll ``MPI_Testall`` and look at
the clock, so the communicator's deadline, abort and peer-failure checks are never held up for
longer than one poll.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

#: polls of an idle progress loop before it starts sleeping between polls
_SPIN_POLLS = 2000
#: polls of a caller's wait before it yields the CPU at every poll (as Open MPI's own blocking
#: calls do when the host is oversubscribed): a peer rank waiting for this core must get it
_WAIT_SPIN_POLLS = 16
#: the longest sleep between polls of pending requests (bounds an async op's added latency)
_MAX_NAP_S = 0.0005

OnError = Callable[[BaseException], BaseException]


class Completion:
    """The future of an MPI op (``add_done_callback``, ``value``, ``set_result``,
    ``set_exception``), completed by the backend's threads. Pure Python on purpose: a daemon
    thread still completing one while the interpreter exits ends inside Python's own code, where
    a ``torch.futures.Future`` would have it unwind through torch's C++ frames and abort the
    process ("terminate called without an active exception", seen at the exit of async ops)."""

    __slots__ = ("_lock", "_done", "_error", "_callbacks")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Completion], None]] = []

    def set_result(self, _value: object = None) -> None:
        self._end(None)

    def set_exception(self, error: BaseException) -> None:
        self._end(error)

    def _end(self, error: BaseException | None) -> None:
        with self._lock:
            if self._done:
                return
            self._done, self._error = True, error
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def add_done_callback(self, callback: Callable[[Completion], None]) -> None:
        with self._lock:
            if not self._done:
                self._callbacks.append(callback)
                return
        callback(self)

    def done(self) -> bool:
        return self._done

    def value(self) -> None:
        if self._error is not None:
            raise self._error


def _check_status(requests: list[Any], status: Any) -> None:
    """``status``: ``None``, one ``MPI.Status`` (of the one request), or a list of one per request."""
    if status is not None and len(requests) != (len(status) if isinstance(status, list) else 1):
        raise ValueError("a status is kept for one request, or a list of them for one each")


def request_test(MPI: Any, requests: list[Any], status: Any = None) -> Callable[[], bool]:  # noqa: N803
    """One poll of ``requests``: True once all completed; a failed request raises its own MPI
    error (``MPI_Testall`` reports any failure as ``MPI_ERR_IN_STATUS``, which would hide a
    peer's failure behind a bare engine error). With ``status`` (one request's ``MPI.Status``,
    or a list of one per request), the completed requests' statuses are written there."""
    _check_status(requests, status)
    if len(requests) == 1 and not isinstance(status, list):
        req = requests[0]
        return req.Test if status is None else (lambda: req.Test(status))  # the bound method: one call a poll
    statuses = status if isinstance(status, list) else [MPI.Status() for _ in requests]
    if not all(isinstance(r, MPI.Request) for r in requests):
        return _each_test(requests, statuses)
    testall, in_status, unfailed = MPI.Request.Testall, MPI.ERR_IN_STATUS, (MPI.SUCCESS, MPI.ERR_PENDING)

    def test() -> bool:
        try:
            return testall(requests, statuses)
        except MPI.Exception as e:
            if e.Get_error_class() != in_status:
                raise
            code = next((c for c in (st.Get_error() for st in statuses) if c not in unfailed), None)
            if code is None:
                raise
            raise MPI.Exception(code) from None

    return test


def _each_test(requests: list[Any], statuses: list[Any]) -> Callable[[], bool]:
    """One poll of requests of which some are request-like objects (``p2p.ProbedRecv``), which
    ``MPI_Testall`` does not take: each not yet completed one tested on its own, its status kept
    once it completed (a completed MPI request is a null one, whose next test would blank it)."""
    left = list(range(len(requests)))

    def test() -> bool:
        nonlocal left
        left = [i for i in left if not requests[i].Test(statuses[i])]
        return not left

    return test


def blocking_wait(MPI: Any, requests: list[Any], on_error: OnError,  # noqa: N803
                  status: Any = None) -> Callable[[float], bool]:
    """A ``BlockingWait`` over ``requests``: polls them for at most the given seconds; True once
    all completed, False if they still run; raises ``on_error(error)`` when one failed (its own
    MPI error, see :func:`request_test`). ``status`` as for :func:`request_test`."""
    # one request and no status (every collective): its bound Test inline, as request_test would
    test = requests[0].Test if status is None and len(requests) == 1 else request_test(MPI, requests, status)
    yield_ = os.sched_yield

    def wait(timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        polls = 0
        while True:
            try:
                if test():
                    return True
            except MPI.Exception as e:
                raise on_error(e) from None
            polls += 1
            if polls > _WAIT_SPIN_POLLS:
                yield_()  # not done at once: let another rank on this core run
            if (polls & 63) == 0 and time.monotonic() >= end:
                return False

    return wait


class _Pending:
    __slots__ = ("requests", "future", "owner", "keep", "on_error", "test")

    def __init__(self, requests: list[Any], future: Completion, owner: object, keep: Any,
                 on_error: OnError, test: Callable[[], bool]) -> None:
        self.requests = requests
        self.future = future
        self.owner = owner
        self.keep = keep  # the buffers MPI reads or writes until the requests complete
        self.on_error = on_error
        self.test = test  # one poll of the requests (see request_test)


class RequestProgress:
    """One thread per process that drives every pending async MPI request to completion and
    completes its future (the op's callbacks then run on this thread)."""

    def __init__(self, MPI: Any) -> None:  # noqa: N803
        self._MPI = MPI
        self._cond = threading.Condition()
        self._pending: list[_Pending] = []
        self._thread: threading.Thread | None = None
        #: requests of aborted owners (and agreements given up) that may still be running: MPI may still touch their
        #: buffers, so these are never freed
        self.abandoned: list[Any] = []

    def submit(self, requests: list[Any], owner: object, keep: Any, on_error: OnError,
               status: Any = None) -> Completion:
        """Drive ``requests`` to completion; the returned future completes then. With ``status``
        (as for :func:`blocking_wait`), the requests' statuses are written there first."""
        test = request_test(self._MPI, requests, status)
        fut = Completion()
        with self._cond:
            self._pending.append(_Pending(requests, fut, owner, keep, on_error, test))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="torchcomms-mpi-progress", daemon=True)
                self._thread.start()
            self._cond.notify()
        return fut

    def abandon(self, owner: object) -> list[_Pending]:
        """Stop driving ``owner``'s requests (its communicator is aborted) and return them; their
        futures are never completed (the communicator already failed its ops)."""
        with self._cond:
            mine = [p for p in self._pending if p.owner is owner]
            self._pending = [p for p in self._pending if p.owner is not owner]
            self.abandoned.extend(mine)
        return mine

    def _poll(self, batch: list[_Pending], mpi_exception: type[BaseException]) -> bool:
        """One poll of ``batch``: the ended ops leave the pending list and their futures
        complete; True if any ended."""
        ended: list[tuple[_Pending, BaseException | None]] = []
        for p in batch:
            try:
                if p.test():
                    ended.append((p, None))
            except mpi_exception as e:
                ended.append((p, p.on_error(e)))
            except Exception as e:  # noqa: BLE001 - e.g. a failed user-defined reduction
                ended.append((p, e))
        if not ended:
            return False
        gone = {id(p) for p, _ in ended}
        with self._cond:
            self._pending = [p for p in self._pending if id(p) not in gone]
        for p, err in ended:
            if err is None:
                p.future.set_result(None)
            else:
                p.future.set_exception(err)
        return True

    def _loop(self) -> None:
        mpi_exception = self._MPI.Exception
        idle = 0
        while True:
            with self._cond:
                while not self._pending:
                    idle = 0
                    self._cond.wait()
                batch = list(self._pending)
            # a method, so that nothing of an ended op (its buffers) stays referenced by this
            # thread's locals while it waits for the next op
            ended = self._poll(batch, mpi_exception)
            batch = []
            if ended:
                idle = 0
                continue
            idle += 1
            if idle > _SPIN_POLLS:
                time.sleep(min(_MAX_NAP_S, 1e-6 * (idle - _SPIN_POLLS)))
            else:
                os.sched_yield()
