"""Typed errors of the launcher; the CLI turns each into one clear line and an exit code."""

from __future__ import annotations

__all__ = [
    "LauncherError",
    "WorkerStartError",
    "UsageError",
    "RendezvousError",
    "RendezvousTimeoutError",
    "RendezvousClosedError",
    "AuthenticationError",
    "ControlPlaneLostError",
]


class LauncherError(RuntimeError):
    """Base class of every launcher error. ``exit_code`` is what the CLI exits with."""

    exit_code: int = 1


class UsageError(LauncherError, ValueError):
    """Bad command-line input or inconsistent settings (exit code 2, like argparse)."""

    exit_code = 2


class RendezvousError(LauncherError):
    """The agents of a job could not agree on a membership."""


class RendezvousTimeoutError(RendezvousError, TimeoutError):
    """Not enough nodes joined before the join timeout.

    ``endpoint`` is the rendezvous address, ``joined`` the hosts that did join and
    ``missing`` how many more were needed to reach the minimum.
    """

    def __init__(self, endpoint: str, joined: list[str], missing: int, timeout: float,
                 message: str | None = None) -> None:
        self.endpoint = endpoint
        self.joined = list(joined)
        self.missing = missing
        self.timeout = timeout
        names = ", ".join(self.joined) if self.joined else "none"
        super().__init__(message or (
            f"rendezvous at {endpoint} timed out after {timeout:g} s: "
            f"{len(self.joined)} node(s) joined ({names}); {missing} more needed"
        ))


class RendezvousClosedError(RendezvousError):
    """This agent arrived after the rendezvous closed (the job already has its nodes)."""


class AuthenticationError(LauncherError):
    """The rendezvous host refused this agent's job secret."""


class ControlPlaneLostError(LauncherError):
    """The rendezvous host (and with it the job's control plane) went away."""


class WorkerStartError(LauncherError):
    """A worker's process could not be started (its program is missing or not executable):
    the shell's codes, 127 for a program not found and 126 for one that cannot be run."""

    def __init__(self, rank: int, argv0: str, error: OSError) -> None:
        self.exit_code = 127 if isinstance(error, FileNotFoundError) else 126
        hint = ""
        if isinstance(error, PermissionError):
            hint = " (--no-python runs the entry point as an executable: make it one, or drop --no-python)"
        super().__init__(f"cannot start rank {rank}'s worker {argv0!r}: "
                         f"{error.strerror or error}{hint}")
