"""The communicator names alive in this process (names must be unique while alive)."""
from __future__ import annotations

import threading
import weakref
from typing import Any

from torchcomms.core.errors import CommValueError


class NameRegistry:
    """Communicator names alive in this process, and how often each name was created (so a
    re-created communicator rendezvous under fresh store keys)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, weakref.ref] = {}
        self._incarnations: dict[str, int] = {}

    def claim(self, name: str) -> int:
        """Reserve ``name``; returns how often it was created before."""
        with self._lock:
            ref = self._live.get(name)
            if ref is not None and ref() is not None:
                raise CommValueError(
                    f"a communicator named {name!r} already exists in this process; names must be unique "
                    "(finalize the old one first)"
                )
            n = self._incarnations.get(name, 0)
            self._incarnations[name] = n + 1
            return n

    def bind(self, name: str, owner: Any) -> None:
        """``name`` is alive as long as ``owner`` is (held weakly)."""
        with self._lock:
            self._live[name] = weakref.ref(owner)

    def release(self, name: str, owner: Any) -> None:
        """``owner`` (or nobody, ``None``: a creation that failed) gives ``name`` up."""
        with self._lock:
            ref = self._live.get(name)
            if ref is not None and ref() in (owner, None):
                del self._live[name]


NAMES = NameRegistry()
