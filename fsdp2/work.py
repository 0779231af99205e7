"""``CommWork``: a ``torch.distributed.Work`` that FSDP can wait on, backed by a ``TorchWork``.

FSDP checks ``isinstance(work, dist.Work)`` before it calls ``wait()``, so the handle must be a
real ``Work``; everything it answers comes from the communicator's own work (its deadline, its
typed error).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class CommWork(dist.Work):
    """Wraps a torchcomms ``TorchWork``; ``after`` (e.g. a copy-out) runs once after success, on
    the first thread that waits, never on the engine's thread; every ``wait()`` returns only
    once it has run, whichever thread ran it."""

    def __init__(self, work: Any, after: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.work = work
        self._after = after
        self._after_lock = threading.Lock() if after is not None else None

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:  # type: ignore[override]
        """Block until the op completed; raises its typed ``CommError`` (never past its deadline).
        ``timeout`` (c10d's signature; zero means the op's own deadline) may only shorten it."""
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout or 0)
        if not self.work.wait(secs if secs > 0 else None):
            return False
        if self._after_lock is not None:
            with self._after_lock:  # a second waiter blocks until the first one's after() ran
                after, self._after = self._after, None
                if after is not None:
                    after()
        return True

    def is_completed(self) -> bool:
        """The engine's op ended (its ``after`` runs in the first ``wait()``)."""
        return bool(self.work.is_completed())

    def is_success(self) -> bool:
        return bool(self.work.is_success())

    def exception(self) -> BaseException | None:  # type: ignore[override]
        return self.work.exception()

    def synchronize(self) -> None:
        self.wait()

    def block_current_stream(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        return self.work.get_future()

    def __repr__(self) -> str:
        return f"CommWork({self.work!r})"
