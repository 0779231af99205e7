"""``TorchWork``: owns an op's completion, its deadline and its error."""
from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from torchcomms.core.errors import CommError, CommTimeoutError, CommValueError
from torchcomms.core.types import WorkStatus

if TYPE_CHECKING:
    from torchcomms.core.op import OpRecord


class WorkOwner(Protocol):
    """What a ``TorchWork`` needs from its communicator: the whole interface between them."""

    def translate_error(self, error: BaseException, record: OpRecord) -> CommError:
        """The typed error of an engine's ``error`` for the op ``record``."""

    def work_ended(self, work: TorchWork, exc: CommError | None) -> None:
        """``work`` reached a terminal status (called once, on the thread that ended it)."""

    def expire(self, work: TorchWork) -> None:
        """``work``'s deadline passed: end it with ``CommTimeoutError`` (if it is still running)."""

#: How long ``wait()`` past the deadline lets another thread finish ending the op (its
#: post-hooks, breaking the communicator) before returning the outcome anyway.
ENDING_GRACE_S = 1.0

_TERMINAL_STATE = {
    WorkStatus.COMPLETED: "completed",
    WorkStatus.TIMEDOUT: "timed_out",
    WorkStatus.ERROR: "failed",
}


class TorchWork:
    """The handle of one operation.

    ``wait()`` returns ``True`` once the op completed, and raises its typed error when it failed.
    It never blocks past the op's deadline (plus a few ms, or at most ``ENDING_GRACE_S`` while
    another thread that ended the op is still in its post-hooks): at the deadline the op fails
    with ``CommTimeoutError`` and its communicator is marked broken.
    """

    __slots__ = ("_owner", "record", "deadline", "_event", "_done", "_status", "_exc", "_lock", "tracked",
                 "stream_op", "__weakref__")

    def __init__(self, owner: WorkOwner, record: OpRecord, deadline: float) -> None:
        self._owner = owner
        self.record = record
        self.deadline = deadline  # time.monotonic() seconds
        self._event: threading.Event | None = None  # made only when someone must block
        self._done = False
        self._status = WorkStatus.INPROGRESS
        self._exc: CommError | None = None
        self._lock = threading.Lock()
        self.tracked = False  # registered with the communicator's in-flight table
        # the engine handle of an op that runs on a device stream (``EngineHandle.stream_ordered``):
        # ``wait()`` makes the current stream wait on it; dropped once the op ended
        self.stream_op: Any = None

    def _waiter(self) -> threading.Event | None:
        """The event to block on, or ``None`` when the work already ended."""
        with self._lock:
            if self._done:
                return None
            if self._event is None:
                self._event = threading.Event()
            return self._event

    # --- completion (called by the engine's callback, the watchdog or the communicator) -----
    @property
    def done(self) -> bool:
        """True once the op ended and its post-hooks ran."""
        return self._done

    def engine_done(self, error: BaseException | None) -> None:
        """The engine ended the op (with ``error``, or successfully)."""
        self.record.in_engine = False
        if error is None:
            op = self.stream_op
            if op is not None:  # the device's own timing of the op (its events have passed: no sync)
                self.record.device_duration_ms = op.device_duration_ms()
            self.finish(WorkStatus.COMPLETED, None)
        else:
            if self._status is not WorkStatus.INPROGRESS:
                # ended already (abort, a peer-failure notice, its deadline): the engine's own
                # error would be discarded, and translating it can wait for the control plane
                # to attribute a connection loss (that the abort itself caused) on the engine's
                # thread, which abort() drains
                return
            exc = self._owner.translate_error(error, self.record)
            self.finish(WorkStatus.TIMEDOUT if isinstance(exc, CommTimeoutError) else WorkStatus.ERROR, exc)

    def finish(self, status: WorkStatus, exc: CommError | None, state: str | None = None) -> bool:
        """Move to a terminal status once; the first caller wins. Returns True if it won."""
        with self._lock:
            if self._status is not WorkStatus.INPROGRESS:
                return False
            self._status = status
            self._exc = exc
        self.stream_op = None  # the engine's work (and the tensors it holds) is no longer needed
        rec = self.record
        rec.time_completed_ns = time.time_ns()
        rec.state = state or ("completed" if status is WorkStatus.COMPLETED else _TERMINAL_STATE[status])
        if exc is not None:
            rec.error = str(exc)
        self._owner.work_ended(self, exc)
        with self._lock:
            self._done = True
            event = self._event
        if event is not None:
            event.set()
        return True

    # --- public API ------------------------------------------------------------------------
    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until the op completes (CPU semantics). On a stream-ordered engine (CUDA) the
        current stream waits on the op instead and the host goes on; the op's deadline is then
        enforced by the watchdog, and a failure shows at the next op or ``wait_blocking()``.
        Raises the op's error. With ``timeout`` shorter than the op's own deadline, returns
        ``False`` if the op is still running then (the op goes on)."""
        op = self.stream_op
        if op is not None and not self._done:
            op.stream_wait()
            return True
        return self.wait_blocking(timeout)

    def wait_blocking(self, timeout: timedelta | float | None = None) -> bool:
        """Block the calling thread until the op ends (also on stream-ordered engines); same
        deadline and ``timeout`` rules as :meth:`wait`."""
        now = time.monotonic()
        limit = self.deadline
        user_limit = None
        if timeout is not None:
            secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
            user_limit = now + max(0.0, secs)
            if user_limit < limit:
                limit = user_limit
        event = self._waiter()
        op = self.stream_op
        if event is not None and op is not None:
            op.urge()  # a stream-ordered engine reports completions lazily unless someone blocks
        if event is not None and not event.wait(max(0.0, limit - now)):
            if user_limit is not None and limit == user_limit and user_limit < self.deadline:
                return False
            self._owner.expire(self)
            # The op has its outcome now. When another thread decided it, that thread may still
            # be ending it (post-hooks, breaking the communicator): wait for that, but bounded.
            event.wait(ENDING_GRACE_S)
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        """True once the op ended, successfully or not (an expired deadline counts as ended)."""
        if not self._done:
            if time.monotonic() >= self.deadline:
                self._owner.expire(self)
            else:
                op = self.stream_op
                if op is not None:
                    op.urge()  # someone polls: report the end promptly
        return self._done

    def is_success(self) -> bool:
        return self._status is WorkStatus.COMPLETED

    @property
    def status(self) -> WorkStatus:
        return self._status

    def exception(self) -> CommError | None:
        """The op's error once it failed, else ``None``."""
        return self._exc

    def source_rank(self) -> int:
        """The rank a receive got its message from: its ``src``, or for ``recv_any_source`` the
        sender, known once the message arrived (``wait()`` first)."""
        rec = self.record
        if str(rec.name) != "recv" or rec.peer is None:
            what = "a receive whose message has not arrived" if str(rec.name) == "recv" else f"a {rec.name}"
            raise CommValueError(f"source_rank() is defined for a received message, not for {what}",
                                 comm=rec.comm_name, op=str(rec.name), seq=rec.seq)
        return int(rec.peer)

    def get_future(self):  # type: ignore[no-untyped-def]
        """A ``torch.futures.Future`` completed with ``None`` (or the error) when the op ends;
        bounded like ``wait()``: by the deadline it holds the op's ``CommTimeoutError``."""
        import torch

        fut: torch.futures.Future = torch.futures.Future()

        def _complete() -> None:
            # wait(), not the bare event: the event is set only once the thread that ended the
            # op finished its post-hooks, and nothing expires an op no watchdog tracks.
            try:
                self.wait_blocking()
            except CommError as e:
                fut.set_exception(e)
            else:
                fut.set_result(None)

        if self._done:
            _complete()
        else:
            threading.Thread(target=_complete, daemon=True, name="torchcomms-future").start()
        return fut

    def __repr__(self) -> str:
        r = self.record
        return f"TorchWork({r.comm_name!r} {r.name} #{r.seq}, {self._status.name})"
