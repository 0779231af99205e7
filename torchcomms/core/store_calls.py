"""Store calls bounded by a deadline, whatever the store's own timeout.

A TCPStore client blocks in ``check``/``get``/``add``/``compare_set``/``wait`` (and in its
constructor) for as long as its host is stopped: the store's own timeout does not bound it. A
control-plane client holds a call until it sees the connection lost (~6 s) or its own per-call
timeout. Changing a shared store's timeout would change it for every other thread that uses the
store, so instead the call runs on a helper (daemon) thread and the caller waits for it only
until its own deadline. A call not answered by then is abandoned: its thread stays blocked in it
(until the store's own timeout ends it, or a stopped host resumes) and exits afterwards.

Such a thread is *parked* (:data:`PARKED`): the interpreter's exit waits for it when its call
ends on its own soon (an ``atexit`` hook), because a thread that returns from C++ into Python
while the interpreter is finalizing is ended by ``pthread_exit``, whose unwinding through
pybind11's GIL guard aborts the process ("terminate called without an active exception"). A call
that ends later than that (an abandoned engine rendezvous waiting for a dead rank until the
communicator's timeout, minutes in a real job) is not waited for: the process is gone long
before the call returns.
"""
from __future__ import annotations

import atexit
import math
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

_T = TypeVar("_T")

#: How long past a deadline a store call may still be answered, where a step is due at the
#: deadline itself (the survivor agreement's proposal) and needs one round trip to the store.
STORE_CALL_GRACE_S = 0.5
#: How often a wait that can also be given up early (``give_up``) looks at it.
_GIVE_UP_POLL_S = 0.005


#: How long past a parked call's own limit the interpreter's exit still waits for it (a loaded
#: machine runs the thread late). A call still blocked after that waits on a host that does not
#: answer (a stopped store host): it stays blocked through the exit, which does not wait for it.
PARKED_EXIT_GRACE_S = 0.2
#: The limit assumed for a parked call whose own limit is not known.
PARKED_DEFAULT_LIMIT_S = 30.0
#: The interpreter's exit waits for a parked call only when it ends on its own within this many
#: seconds; one that ends later returns after the process has finished exiting (finalization
#: takes well under this), so waiting for it would only hold the exit up for as long.
PARKED_EXIT_WAIT_MAX_S = 5.0


class ParkedCalls:
    """Threads left inside calls nobody waits for any more, each with the time
    (``time.monotonic()``) by which its call ends on its own. At the interpreter's exit
    (``atexit``: before finalization begins) each that ends soon is waited for until then, so
    none returns into a finalizing interpreter; one still running after that is named on stderr."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[threading.Thread, float] = {}
        self._hooked = False

    def park(self, thread: threading.Thread, limit_s: float | None) -> None:
        """``thread`` runs a call that ends on its own within ``limit_s`` from now (``None``:
        unknown, :data:`PARKED_DEFAULT_LIMIT_S`)."""
        limit = PARKED_DEFAULT_LIMIT_S if limit_s is None or not math.isfinite(limit_s) else max(0.0, limit_s)
        with self._lock:
            for t in [t for t in self._threads if not t.is_alive()]:
                del self._threads[t]
            ends_by = time.monotonic() + limit + PARKED_EXIT_GRACE_S
            self._threads[thread] = max(ends_by, self._threads.get(thread, 0.0))
            if not self._hooked:
                self._hooked = True
                atexit.register(self.wait_all)

    def running(self) -> list[threading.Thread]:
        """The parked threads still running."""
        with self._lock:
            return [t for t in self._threads if t.is_alive()]

    def wait_all(self) -> list[threading.Thread]:
        """Wait for each parked thread whose call ends on its own within
        :data:`PARKED_EXIT_WAIT_MAX_S`, until then; returns (and names on stderr) those of them
        still running after it. Threads whose calls end later are left to run (not returned)."""
        with self._lock:
            threads = list(self._threads.items())
        left = []
        for thread, ends_by in threads:
            wait_s = ends_by - time.monotonic()
            if wait_s > PARKED_EXIT_WAIT_MAX_S:
                continue  # it returns after the process has exited
            thread.join(max(0.0, wait_s))
            if thread.is_alive():
                left.append(thread)
        if left:
            names = ", ".join(t.name for t in left)
            print(f"torchcomms: at exit, thread(s) {names} are still blocked in a call past its limit; "
                  f"the process may abort when they return", file=sys.stderr, flush=True)
        return left


#: The process's parked calls (a registry).
PARKED = ParkedCalls()


def store_limit_s(store: Any) -> float | None:
    """``store``'s own timeout in seconds (what bounds each of its calls), if it has one."""
    try:
        return float(innermost_store(store).timeout.total_seconds())
    except Exception:  # noqa: BLE001 - not a c10d store, or one without a timeout
        return None


class StoreNotAnswering(TimeoutError):
    """A store call was not answered by its caller's deadline (the store's host is stopped,
    overloaded or unreachable). ``call`` names the call, ``waited_s`` how long it was waited for."""

    def __init__(self, call: str, waited_s: float) -> None:
        self.call = call
        self.waited_s = waited_s
        super().__init__(f"the store did not answer {call} within {waited_s:.2f} s")


class EngineNotReady(TimeoutError):
    """An engine was not built by its deadline (a rank never joined its rendezvous, or the
    store did not answer), or a member failed meanwhile."""


def innermost_store(store: Any) -> Any:
    """The store that ``store`` wraps, through any number of ``PrefixStore``s."""
    while getattr(store, "underlying_store", None) is not None:  # PrefixStore
        store = store.underlying_store
    return store


def describe_store(store: Any) -> str:
    """``store`` in words for an error message: its kind, and its address where it has one."""
    inner = innermost_store(store)
    address = getattr(getattr(inner, "client", None), "address", None)
    if isinstance(address, str):
        return f"the control-plane store at {address}"
    host, port = getattr(inner, "host", None), getattr(inner, "port", None)
    if host is not None and port is not None:
        return f"the {type(inner).__name__} at {host}:{port}"
    return f"the {type(inner).__name__}"


def or_store_silent(store: Any) -> str:
    """``", or <the store> did not answer"``, for a wait that the store's silence could explain;
    nothing for an engine that has no store (MPI)."""
    return "" if store is None else f", or {describe_store(store)} did not answer"


def cancel_calls(store: Any, thread: threading.Thread) -> None:
    """Where ``store`` can, fail the call ``thread`` is blocked in, and every later one it makes
    through ``store``: an abandoned call then ends instead of waiting for a store that does not
    answer. The control plane's client can (``cancel_calls_of``): its calls run Python code, and
    a thread still doing so inside an engine's C++ frames when the interpreter exits aborts the
    process. A TCPStore cannot, and need not: its calls wait in C++, without the interpreter."""
    cancel = getattr(getattr(innermost_store(store), "client", None), "cancel_calls_of", None)
    if cancel is not None:
        cancel(thread)


class PendingCall(Generic[_T]):
    """One call, made on a thread of its own or handed to a helper; any number of callers may
    wait for it, each until its own deadline (:meth:`wait`)."""

    __slots__ = ("_fn", "_on_end", "_lock", "done", "result", "error", "_abandoned", "thread")

    def __init__(self, fn: Callable[[], _T], on_end: Callable[[PendingCall[_T]], None] | None = None) -> None:
        self._fn = fn
        self._on_end = on_end  # called on the call's thread once it ended (before waiters wake)
        self._lock = threading.Lock()
        self.done = threading.Event()
        self.result: _T | None = None
        self.error: BaseException | None = None
        self._abandoned: Callable[[_T], None] | None = None
        self.thread: threading.Thread | None = None  # the thread it runs on, once started

    def start(self, thread_name: str) -> PendingCall[_T]:
        """Run the call on a new daemon thread; returns self."""
        self.thread = threading.Thread(target=self.run, name=thread_name, daemon=True)
        self.thread.start()
        return self

    def run(self) -> None:
        try:
            result = self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiters
            self.error = e
        else:
            self.result = result
        if self._on_end is not None:
            self._on_end(self)
        with self._lock:
            self.done.set()
            late = self._abandoned if self.error is None else None
        if late is not None:
            late(self.result)  # type: ignore[arg-type]

    def wait(self, what: str, until: float, give_up: Callable[[], bool] | None = None) -> _T:
        """The call's result (or its error, raised) once it ends; :class:`StoreNotAnswering`
        naming ``what`` when it has not ended by ``until`` (``time.monotonic()`` seconds), or
        as soon as ``give_up()`` turns true. The call itself goes on."""
        start = time.monotonic()
        while True:
            left = until - time.monotonic()
            if math.isinf(left) and give_up is None:
                self.done.wait()
            else:
                step = max(0.0, left) if give_up is None else max(0.0, min(left, _GIVE_UP_POLL_S))
                self.done.wait(step)
            if self.done.is_set():
                break
            if time.monotonic() >= until or (give_up is not None and give_up()):
                raise StoreNotAnswering(what, time.monotonic() - start)
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]

    def abandon(self, on_late: Callable[[_T], None]) -> bool:
        """Nobody will use the result: ``on_late(result)`` disposes of it when (if) the call
        succeeds later. Returns False, and does nothing, when the call has ended already."""
        with self._lock:
            if self.done.is_set():
                return False
            self._abandoned = on_late
            return True


def call_until(what: str, fn: Callable[[], _T], until: float, *, thread_name: str,
               give_up: Callable[[], bool] | None = None, on_late: Callable[[_T], None] | None = None,
               store: Any = None, limit_s: float | None = None) -> _T:
    """``fn()`` on a daemon thread of its own, waited for until ``until`` or until ``give_up()``
    (see :meth:`PendingCall.wait`). When it is abandoned, the calls it makes through ``store``
    are cancelled where the store can (:func:`cancel_calls`), and a result it still returns
    later is handed to ``on_late`` (to abort an engine nobody will use, say), and the thread
    is parked (:data:`PARKED`) for ``limit_s`` seconds from the call's start (the limit that
    ends it on its own, when it has one: an engine's rendezvous timeout)."""
    started = time.monotonic()
    call = PendingCall(fn).start(thread_name)
    try:
        return call.wait(what, until, give_up)
    except StoreNotAnswering:
        if call.abandon(on_late or (lambda _result: None)):
            if call.thread is not None:
                if store is not None:
                    cancel_calls(store, call.thread)
                if limit_s is not None:  # one that outlives its own limit is stuck: exit leaves it
                    PARKED.park(call.thread, started + limit_s - time.monotonic())
            raise
    # it ended just as it was abandoned
    if call.error is not None:
        raise call.error
    return call.result  # type: ignore[return-value]


class BoundedCalls:
    """Store calls made one at a time on one helper (daemon) thread, each waited for until
    ``until`` (``time.monotonic()`` seconds): for a sequence of calls under one deadline (the
    survivor agreement's). A call that misses it is abandoned, and the helper exits after it.

    A call is waited for at least :data:`STORE_CALL_GRACE_S`, also when ``until`` is nearer or
    has passed already (its caller ran late: a descheduled thread on a loaded host), and that
    grace counts from when the store is asked to answer (``answer_in_s``: a ``wait``'s own
    timeout, which the store's host then ends with one more round trip): only a store that was
    asked and did not answer raises :class:`StoreNotAnswering`."""

    def __init__(self, until: float, thread_name: str = "torchcomms-store-calls", limit_s: float | None = None) -> None:
        self._until = until
        self._limit_s = limit_s  # what ends one call on its own (the store's timeout)
        self._thread_name = thread_name
        self._jobs: queue.SimpleQueue[PendingCall[Any] | None] = queue.SimpleQueue()
        self._helper: threading.Thread | None = None

    def __call__(self, what: str, fn: Callable[[], _T], answer_in_s: float = 0.0) -> _T:
        if self._helper is None:
            self._helper = threading.Thread(target=self._serve, args=(self._jobs,),
                                            name=self._thread_name, daemon=True)
            self._helper.start()
        # a call made at (or past) the deadline, or a wait that ends there
        until = max(self._until, time.monotonic() + answer_in_s + STORE_CALL_GRACE_S)
        call = PendingCall(fn)
        self._jobs.put(call)
        try:
            return call.wait(what, until)
        except StoreNotAnswering:
            if self._limit_s is not None:
                PARKED.park(self._helper, self._limit_s)
            raise

    def close(self) -> None:
        """Let the helper exit (after the call it may still be blocked in)."""
        if self._helper is not None:
            self._jobs.put(None)

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[PendingCall[Any] | None]) -> None:
        while (call := jobs.get()) is not None:
            call.run()
