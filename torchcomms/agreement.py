"""Survivor agreement over a key-value store: every survivor gets the same member list.

Survivors check in under a membership epoch; once every member not known to have failed has
checked in (or the deadline passed), a proposal is written with compare-and-set. The first
proposal wins and everybody adopts it, so there is no split brain by construction. Works on any
torch ``Store`` (the control plane's, or a TCPStore).

Every store call is bounded by the agreement's deadline, whatever the store's own timeout: a
store whose host is stopped or cut off raises :class:`StoreNotAnswering` at the deadline (plus
``STORE_CALL_GRACE_S``). The store's own timeout cannot do that: a TCPStore client blocks in
``check``/``get``/``compare_set`` for ever while its host is stopped, and changing a shared
store's timeout would change it for every other thread that uses the store.
"""
from __future__ import annotations

import json
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")

#: How long past the deadline a store call may still be answered: the proposal is written when
#: the deadline passes, and needs one round trip to the store.
STORE_CALL_GRACE_S = 0.5


class StoreNotAnswering(TimeoutError):
    """A store call was not answered by the agreement's deadline (the store's host is stopped,
    overloaded or unreachable). ``call`` names the call, ``waited_s`` how long it was waited for."""

    def __init__(self, call: str, waited_s: float) -> None:
        self.call = call
        self.waited_s = waited_s
        super().__init__(f"the store did not answer {call} within {waited_s:.2f} s")


def describe_store(store: Any) -> str:
    """``store`` in words for an error message: its kind, and its address where it has one."""
    inner = store
    while getattr(inner, "underlying_store", None) is not None:  # PrefixStore
        inner = inner.underlying_store
    address = getattr(getattr(inner, "client", None), "address", None)
    if isinstance(address, str):
        return f"the control-plane store at {address}"
    host, port = getattr(inner, "host", None), getattr(inner, "port", None)
    if host is not None and port is not None:
        return f"the {type(inner).__name__} at {host}:{port}"
    return f"the {type(inner).__name__}"


class _Call:
    """One store call handed to the helper thread, and its outcome."""

    __slots__ = ("fn", "done", "result", "error")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            self.error = e
        self.done.set()


class _BoundedCalls:
    """Store calls made one at a time on a helper (daemon) thread, each waited for until
    ``until`` (``time.monotonic()`` seconds). A call that misses it is abandoned: the helper
    stays blocked in it (until the store's own timeout ends it, or until a stopped host resumes)
    and exits afterwards. Nothing of the store is changed, so other threads using the same store
    are not affected."""

    def __init__(self, until: float) -> None:
        self._until = until
        self._jobs: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._helper: threading.Thread | None = None

    def __call__(self, what: str, fn: Callable[[], _T]) -> _T:
        if self._helper is None:
            self._helper = threading.Thread(target=self._serve, args=(self._jobs,),
                                            name="torchcomms-agreement-store", daemon=True)
            self._helper.start()
        call = _Call(fn)
        start = time.monotonic()
        self._jobs.put(call)
        left = self._until - start
        if not call.done.wait(None if math.isinf(left) else max(0.0, left)):
            raise StoreNotAnswering(what, time.monotonic() - start)
        if call.error is not None:
            raise call.error
        return call.result

    def close(self) -> None:
        """Let the helper exit (after the call it may still be blocked in)."""
        if self._helper is not None:
            self._jobs.put(None)

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[_Call | None]) -> None:
        while (call := jobs.get()) is not None:
            call.run()


def _decode(raw: bytes) -> list[int]:
    data = json.loads(raw.decode())
    if not isinstance(data, list) or not all(isinstance(r, int) for r in data):
        raise ValueError(f"malformed membership decision {raw!r}")
    return data


def agree_on_survivors(
    store: Any,
    key_prefix: str,
    me: int,
    candidates: list[int],
    known_failed: Callable[[], set[int]],
    deadline: float,
    poll_s: float = 0.002,
) -> list[int]:
    """The agreed survivor list (sorted global ranks). ``me`` checks in first; the result may
    not contain ``me`` (it was too late, or declared failed). Returns or raises by ``deadline``
    plus ``STORE_CALL_GRACE_S``: :class:`StoreNotAnswering` when a store call was not answered
    by then; an error the store raised is raised as it is."""
    call = _BoundedCalls(deadline + STORE_CALL_GRACE_S)
    try:
        check_in = f"{key_prefix}/in/{me}"
        call(f"set({check_in!r})", lambda: store.set(check_in, b"1"))
        decision_key = f"{key_prefix}/decision"
        arrived: set[int] = set()
        while True:
            if call(f"check({decision_key!r})", lambda: store.check([decision_key])):
                return _decode(call(f"get({decision_key!r})", lambda: store.get(decision_key)))
            failed = known_failed()
            expected = [r for r in candidates if r not in failed]
            for r in expected:
                key = f"{key_prefix}/in/{r}"
                if r not in arrived and call(f"check({key!r})", lambda: store.check([key])):
                    arrived.add(r)
            if all(r in arrived for r in expected) or time.monotonic() >= deadline:
                proposal = json.dumps(sorted(r for r in arrived if r not in failed)).encode()
                stored = call(f"compare_set({decision_key!r})", lambda: store.compare_set(decision_key, b"", proposal))
                return _decode(stored if stored else proposal)
            time.sleep(poll_s)
    finally:
        call.close()
