"""Engines let go of at the interpreter's exit, before its finalization.

An engine that no communicator finalized is otherwise destroyed during finalization, or never.
Its threads (gloo's workers, c10d NCCL's watchdog, our completion poller) may then still let
go of ops whose tensors the program dropped: freeing their Python objects needs the
interpreter, and once finalization has begun a thread asking for it is ended by
``pthread_exit``, whose unwinding through a C++ destructor aborts the process ("terminate
called without an active exception"). ``atexit`` runs before that, with the interpreter whole:
each engine watched here is asked to let go of what it holds then (``release_at_exit``), and
decides itself whether it safely can (an engine with an op still pending must not wait on it).
"""
from __future__ import annotations

import atexit
import weakref
from typing import Protocol

__all__ = ["ReleasedAtExit", "watch"]


class ReleasedAtExit(Protocol):
    def release_at_exit(self) -> None:
        """Let go of the engine now if that cannot block; never raises on purpose."""


#: engines in use (a registry: entries leave when their backend is collected)
_LIVE: weakref.WeakSet[ReleasedAtExit] = weakref.WeakSet()


def watch(backend: ReleasedAtExit) -> None:
    """Have ``backend.release_at_exit()`` called at the interpreter's exit while it lives."""
    if not _LIVE:
        atexit.unregister(_release_all)  # registered once, however often _LIVE empties
        atexit.register(_release_all)
    _LIVE.add(backend)


def _release_all() -> None:
    for backend in list(_LIVE):
        try:
            backend.release_at_exit()
        except Exception:  # noqa: BLE001 - exit goes on whatever one engine does
            pass
