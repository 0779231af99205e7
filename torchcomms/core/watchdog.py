"""The ops in flight of one communicator and the watchdog thread that ends each at its deadline,
even when nobody waits on it."""
from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable

from torchcomms.core.work import TorchWork

#: the shortest sleep of a watchdog with no op in flight (a tiny default timeout must not make it spin)
IDLE_WATCH_MIN_S = 1.0


class Watchdog:
    """In-flight table and deadline heap under the communicator's ``lock``; the thread starts
    with the first tracked op and ends once ``retired()`` is true (woken by :meth:`stop`)."""

    def __init__(self, name: str, lock: threading.Lock, expire: Callable[[TorchWork], None],
                 retired: Callable[[], bool], idle_s: Callable[[], float]) -> None:
        self.name = name
        self.lock = lock
        self.wake = threading.Condition(lock)
        self.inflight: dict[int, TorchWork] = {}
        self.deadlines: list[tuple[float, int]] = []
        self._expire = expire
        self._retired = retired
        self._idle_s = idle_s  # with nothing in flight, sleep this long (the default timeout)
        self._thread: threading.Thread | None = None
        self._watch_until: float | None = None  # when the thread next wakes (None: not started)

    def track(self, work: TorchWork) -> None:
        """Follow ``work`` until it ends (:meth:`forget`) or its deadline passes."""
        work.tracked = True
        with self.lock:
            self.inflight[work.record.op_id] = work
            heapq.heappush(self.deadlines, (work.deadline, work.record.op_id))
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name=f"torchcomms-watchdog-{self.name}",
                                                daemon=True)
                self._thread.start()
            elif self._watch_until is None or work.deadline < self._watch_until:
                self.wake.notify()  # only when it would otherwise sleep past this deadline

    def forget(self, work: TorchWork) -> None:
        """``work`` ended."""
        with self.lock:
            self.inflight.pop(work.record.op_id, None)
            # Deadlines of ended ops stay in the heap until the watchdog next wakes (up to a
            # timeout away); rebuild it when they dominate, so it stays O(ops in flight).
            if len(self.deadlines) > 2 * len(self.inflight) + 64:
                self.deadlines = [(w.deadline, oid) for oid, w in self.inflight.items()]
                heapq.heapify(self.deadlines)

    def pending_locked(self) -> list[TorchWork]:
        """The works in flight (the caller holds ``lock``)."""
        return list(self.inflight.values())

    def stop_locked(self) -> None:
        """Wake the thread so that it sees the communicator retired (the caller holds ``lock``)."""
        self.wake.notify_all()

    def _watch(self) -> None:
        with self.lock:
            while not self._retired():
                now = time.monotonic()
                expired: list[TorchWork] = []
                while self.deadlines and (self.deadlines[0][0] <= now or self.deadlines[0][1] not in self.inflight):
                    _, op_id = heapq.heappop(self.deadlines)
                    w = self.inflight.get(op_id)
                    if w is not None:
                        expired.append(w)
                if expired:
                    self.lock.release()
                    try:
                        for w in expired:
                            self._expire(w)
                    finally:
                        self.lock.acquire()
                    continue
                # With nothing in flight, sleep one default timeout: an op started from now on
                # with that timeout ends later, so only a shorter one needs to wake the watchdog.
                self._watch_until = (self.deadlines[0][0] if self.deadlines
                                     else now + max(self._idle_s(), IDLE_WATCH_MIN_S))
                self.wake.wait(self._watch_until - now)
