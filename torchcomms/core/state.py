"""The communicator's lifecycle: its states and the one table of the moves between them."""
from __future__ import annotations

import enum

from torchcomms.core.errors import CommError


class CommState(enum.Enum):
    """Where a communicator stands (``repr(comm)`` shows the value)."""

    ACTIVE = "active"  # ops run
    BROKEN = "broken"  # a timeout or failure broke it; recover with shrink() or reconfigure()
    RECONFIGURING = "reconfiguring"  # a reconfigure() is building its new engine
    REVOKED = "revoked"  # aborted, but it may still be reconfigured (enable_reconfigure=True)
    ABORTED = "aborted"  # abort() ended it
    FINALIZED = "finalized"  # finalize() released it
    SHRUNK = "shrunk"  # shrink() replaced it by the communicator it returned
    EXPELLED = "expelled"  # this rank was declared failed: it cannot rejoin

    def __str__(self) -> str:
        return self.value


S = CommState

#: The only moves a communicator makes; anything else is a bug (:class:`IllegalTransition`).
#: (RECONFIGURING -> RECONFIGURING: a later reconfigure() supersedes one still in progress.)
TRANSITIONS: dict[CommState, frozenset[CommState]] = {
    S.ACTIVE: frozenset({S.BROKEN, S.RECONFIGURING, S.REVOKED, S.ABORTED, S.FINALIZED, S.EXPELLED}),
    S.BROKEN: frozenset({S.ACTIVE, S.RECONFIGURING, S.REVOKED, S.ABORTED, S.FINALIZED, S.SHRUNK, S.EXPELLED}),
    S.RECONFIGURING: frozenset({S.RECONFIGURING, S.ACTIVE, S.BROKEN, S.REVOKED, S.ABORTED, S.FINALIZED, S.EXPELLED}),
    S.REVOKED: frozenset({S.RECONFIGURING, S.FINALIZED, S.EXPELLED}),
    S.ABORTED: frozenset({S.EXPELLED}),
    S.SHRUNK: frozenset({S.EXPELLED}),
    S.FINALIZED: frozenset(),
    S.EXPELLED: frozenset(),
}

#: States a communicator never leaves for a usable one: no op can start, every one in flight
#: has been failed, so its watchdog thread ends.
RETIRED = frozenset({S.FINALIZED, S.ABORTED, S.SHRUNK, S.EXPELLED})
#: States in which ``is_aborted()`` is true.
ABORTED_STATES = frozenset({S.ABORTED, S.REVOKED})


class IllegalTransition(CommError):
    """A move the transition table does not allow (a bug in torchcomms, never user error)."""


class Lifecycle:
    """A communicator's current state; every change goes through :meth:`move`. Not locked by
    itself: the communicator changes it under its own lock."""

    __slots__ = ("state", "comm")

    def __init__(self, comm: str) -> None:
        self.comm = comm
        self.state = CommState.ACTIVE

    def can(self, to: CommState) -> bool:
        return to in TRANSITIONS[self.state]

    def move(self, to: CommState) -> None:
        """Go to ``to``; raises :class:`IllegalTransition` when the table has no such move."""
        if to not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"communicator cannot go from {self.state} to {to}", comm=self.comm)
        self.state = to

    @property
    def retired(self) -> bool:
        return self.state in RETIRED
