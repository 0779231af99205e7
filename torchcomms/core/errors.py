"""The error hierarchy: every failure of a communicator is a typed ``CommError``.

``CommError`` subclasses ``RuntimeError`` so code written for c10d (which raises
``RuntimeError``/``DistBackendError``) still catches it. Argument errors additionally subclass
``ValueError``/``TypeError`` and are raised before anything leaves the process.
"""
from __future__ import annotations

from collections.abc import Iterable


def format_ranks(ranks: Iterable[int]) -> str:
    """Render ranks compactly: [0, 1, 2, 5] -> '0-2,5'."""
    rs = sorted(set(int(r) for r in ranks))
    if not rs:
        return "none"
    parts: list[str] = []
    start = prev = rs[0]
    for r in rs[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(parts)


class CommError(RuntimeError):
    """Base class of every torchcomms failure.

    Attributes name where it happened: ``comm`` (communicator name), ``op`` (op name),
    ``seq`` (the op's sequence number on that communicator) and ``ranks`` (ranks involved);
    ``message`` is the text without that location.
    """

    def __init__(
        self,
        message: str,
        *,
        comm: str | None = None,
        op: str | None = None,
        seq: int | None = None,
        ranks: Iterable[int] | None = None,
    ) -> None:
        self.message = message
        self.comm = comm
        self.op = op
        self.seq = seq
        self.ranks = sorted(set(ranks)) if ranks is not None else None
        where = []
        if comm is not None:
            where.append(f"comm '{comm}'")
        if op is not None:
            where.append(f"{op}" + (f" #{seq}" if seq is not None else ""))
        prefix = f"[{', '.join(where)}] " if where else ""
        super().__init__(prefix + message)


class CommTimeoutError(CommError):
    """An operation did not complete before its deadline.

    ``missing_ranks`` lists the ranks known not to have arrived (when the control plane
    knows them), ``timeout_s`` the deadline that was exceeded.
    """

    def __init__(
        self,
        message: str,
        *,
        timeout_s: float | None = None,
        missing_ranks: Iterable[int] | None = None,
        **kw: object,
    ) -> None:
        self.timeout_s = timeout_s
        self.missing_ranks = sorted(set(missing_ranks)) if missing_ranks is not None else None
        if self.missing_ranks:
            message += f"; ranks that never arrived: {format_ranks(self.missing_ranks)}"
        super().__init__(message, **kw)  # type: ignore[arg-type]


class PeerFailureError(CommError):
    """A peer of this communicator failed; ``failed_ranks`` says which, ``detected_by`` how:
    ``engine`` (the engine's own error), a ``rank_failed`` event's reason (``exited``, ``killed``,
    ``hung``, ``stopped``, ``unreapable``, ``heartbeat``), ``node_lost``, or ``process_gone``
    (the store watch); several, comma-separated, when the failed ranks were found differently."""

    def __init__(
        self,
        message: str,
        *,
        failed_ranks: Iterable[int] | None = None,
        detected_by: str = "engine",
        **kw: object,
    ) -> None:
        self.failed_ranks = sorted(set(failed_ranks)) if failed_ranks is not None else []
        self.detected_by = detected_by
        if self.failed_ranks:
            message += f"; failed ranks: {format_ranks(self.failed_ranks)} (detected by {detected_by})"
        super().__init__(message, **kw)  # type: ignore[arg-type]


class CommAbortedError(CommError):
    """The communicator was aborted, finalized or broken by an earlier failure."""


class CollectiveMismatchError(CommError):
    """Ranks called different collectives (or the same one with different shapes) at one seq."""


class BackendError(CommError):
    """The engine reported an error that is neither a timeout nor a known peer failure."""


class CommArgumentError(CommError):
    """Base for argument errors: raised locally, before dispatch."""


class CommValueError(CommArgumentError, ValueError):
    """An argument has a bad value (shape, size, rank, split sizes, ...)."""


class CommTypeError(CommArgumentError, TypeError):
    """An argument has a bad type (not a tensor, wrong dtype, wrong device, ...)."""


class BackendNotFoundError(CommValueError, ModuleNotFoundError):
    """No backend is registered under the requested name (also a ``ModuleNotFoundError``, as the
    reference raises: "failed to find backend ...")."""


__all__ = [
    "BackendError",
    "BackendNotFoundError",
    "CollectiveMismatchError",
    "CommAbortedError",
    "CommArgumentError",
    "CommError",
    "CommTimeoutError",
    "CommTypeError",
    "CommValueError",
    "PeerFailureError",
]
