"""The one map from engine, store and build failures to the typed errors of ``errors``.

Every place that catches an engine's, a store's or an engine build's exception hands it here:
ops (``translate_engine_error``), engine builds of ``new_comm``, split, shrink, reconfigure and
the collective check (``build_error``, ``engine_not_built``), the survivor agreement
(``agreement_error``), set-up steps that call the store (``store_error``). ``where`` is always
the error's location: ``dict(comm=..., op=..., seq=...)``.
"""
from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

import torch.distributed as dist

from torchcomms.core.errors import (
    BackendError,
    CollectiveMismatchError,
    CommAbortedError,
    CommError,
    CommTimeoutError,
    CommValueError,
    PeerFailureError,
)
from torchcomms.core.store_calls import StoreNotAnswering, describe_store, or_store_silent


class FailureWitness(Protocol):
    """What the control plane knows about failures (the failure monitor implements it)."""

    attribution_wait_s: float
    control_lost: str | None

    def explain_connection_loss(self, members: list[int], wait_s: float) -> tuple[str, Any] | None: ...


def engine_error(kind: str, error: BaseException, timeout_s: float, where: Mapping[str, Any]) -> CommError:
    """The typed error of an engine's ``error``, as its backend classified it (``kind``:
    ``"timeout"``, ``"peer"``, ``"mismatch"`` (a message that did not fit the buffer posted for
    it: the ranks' calls differ) or anything else)."""
    msg = f"engine error: {error}".strip()
    if kind == "timeout":
        return CommTimeoutError(msg, timeout_s=timeout_s, **where)
    if kind == "peer":  # unattributed: the peer that closed the connection may not be the one that failed
        return PeerFailureError(f"{msg} (a peer failed, or broke off this communicator after a failure it saw)",
                                detected_by="engine", **where)
    if kind == "mismatch":
        return CollectiveMismatchError(msg, **where)
    return BackendError(msg, **where)


def translate_engine_error(error: BaseException, kind: str, timeout_s: float, where: Mapping[str, Any],
                           global_ranks: Sequence[int], witness: FailureWitness | None) -> CommError:
    """An op's engine error (classified ``kind`` by its backend) as a typed error; a lost peer
    is attributed through the control plane (``witness``) where there is one."""
    if isinstance(error, CommError):
        return _located(error, where)
    if kind == "peer" and witness is not None:  # the control plane may know who failed
        verdict = witness.explain_connection_loss(list(global_ranks), min(witness.attribution_wait_s, timeout_s))
        if verdict is not None and verdict[0] == "control_lost":
            return CommAbortedError(f"{verdict[1]} (the engine then lost a peer: {error})", **where)
        if verdict is not None:
            failed = verdict[1]
            return PeerFailureError(
                f"engine error: {error}".strip(),
                failed_ranks=[list(global_ranks).index(g) for g in sorted(failed)],
                detected_by=",".join(sorted(set(failed.values()))), **where)
    return engine_error(kind, error, timeout_s, where)


def _located(error: CommError, where: Mapping[str, Any]) -> CommError:
    """``error`` naming the communicator, op and sequence number of ``where``, when an engine
    raised it without them (a framed receive's mismatch names only the ranks; gloo's refusal of
    ranks that disagree on the collective check, only the communicator)."""
    if error.seq is not None or type(error) not in (CommError, CollectiveMismatchError, BackendError, CommValueError):
        return error
    located = type(error)(error.message, ranks=error.ranks, **where)
    located.__cause__ = error
    return located


def store_error(error: BaseException, store_words: str, secs: float, where: Mapping[str, Any], *,
                step: str = "", control_lost: str | None = None) -> CommError | None:
    """The typed error of a step that failed because of its store (``store_words`` names it,
    ``step`` says where, e.g. ``" in the survivor agreement"``), else ``None``.

    Not answered by the step's deadline of ``secs`` → :class:`CommTimeoutError`; its connection
    lost (the host is gone) → :class:`CommAbortedError`. Where the store is the control plane
    and it is known lost (``control_lost``: the failure monitor's message), that is the error."""
    if not isinstance(error, (StoreNotAnswering, dist.DistNetworkError)):
        return None
    if control_lost is not None:
        return CommAbortedError(control_lost, **where)
    if isinstance(error, StoreNotAnswering):
        return CommTimeoutError(
            f"{store_words} did not answer {error.call}{step} within {secs:g} s (its host is stopped, overloaded "
            "or unreachable)", timeout_s=secs, **where)
    return CommAbortedError(f"{store_words} failed{step}: {error} (its host is gone or unreachable)", **where)


def store_connect_error(error: BaseException, store_words: str, secs: float, where: Mapping[str, Any]) -> CommError:
    """The typed error of a store that could not be connected to at all."""
    if "EADDRINUSE" in str(error):  # rank 0 could not host it: not a host that is gone
        return CommValueError(
            f"rank 0 could not host {store_words}: the port is in use (another job's store, or another process "
            "started as rank 0); pick a free MASTER_PORT", **where)
    return store_error(error, store_words, secs, where) or CommAbortedError(
        f"could not connect to {store_words}: {error}", **where)


def build_error(error: BaseException, store: Any, timeout_s: float, where: Mapping[str, Any], kind: str,
                global_ranks: Sequence[int], witness: FailureWitness | None) -> CommError:
    """The typed error of an engine build (split, shrink, reconfigure, the collective check)
    that raised ``error`` (classified ``kind`` by the backend): the store's connection failed
    (its host is gone), or the engine's."""
    if isinstance(error, dist.DistNetworkError):  # raised by a store client, not by an engine's peers
        return store_error(  # type: ignore[return-value]
            error, describe_store(store), timeout_s, where, step=" while the new engine rendezvoused",
            control_lost=witness.control_lost if witness is not None else None)
    return translate_engine_error(error, kind, timeout_s, where, global_ranks, witness)


def engine_start_error(error: BaseException, kind: str, store_words: str, secs: float,
                       where: Mapping[str, Any]) -> CommError:
    """The typed error of ``new_comm``'s engine that failed to start."""
    typed = store_error(error, store_words, secs, where)
    if typed is not None:
        return typed
    if isinstance(error, CommError):
        return _located(error, where)
    return engine_error(kind, error, secs, where)


def engine_not_ready(store_words: str, secs: float, where: Mapping[str, Any]) -> CommTimeoutError:
    """``new_comm``'s engine rendezvous did not end by its deadline."""
    return CommTimeoutError(
        f"the engine was not ready within {secs:g} s (a rank never joined its rendezvous, or {store_words} "
        "did not answer)", timeout_s=secs, **where)


def monitor_start_error(error: BaseException, store_words: str, secs: float, deadline: float,
                        where: Mapping[str, Any]) -> CommError:
    """The typed error of a failure monitor that could not start: its store calls are bounded
    by ``deadline``, so one that fails at it was not answered in time."""
    if time.monotonic() >= deadline:
        return CommTimeoutError(
            f"{store_words} did not answer the failure monitor's start within {secs:g} s (its host is stopped, "
            f"overloaded or unreachable): {error}", timeout_s=secs, **where)
    return CommAbortedError(f"{store_words} failed when the failure monitor started: {error}", **where)


def agreement_error(error: Exception, store: Any, secs: float, where: Mapping[str, Any],
                    control_lost: str | None) -> CommError:
    """The typed error of a shrink whose survivor agreement failed with ``error``: the store
    did not answer by the deadline (``StoreNotAnswering``), or raised."""
    if isinstance(error, CommError):
        return error
    if control_lost is not None:  # whatever the store raised: without the control plane nothing is agreed
        return CommAbortedError(control_lost, **where)
    words = describe_store(store)
    typed = store_error(error, words, secs, where, step=" in the survivor agreement")
    if typed is not None:
        return typed
    if isinstance(error, (TimeoutError, dist.DistStoreError)):
        return CommTimeoutError(f"{words} timed out in the survivor agreement: {error}", timeout_s=secs, **where)
    return CommAbortedError(f"{words} failed in the survivor agreement: {error}", **where)


def engine_not_built(what: str, members: Collection[int], failures: Mapping[int, str],
                     global_ranks: Sequence[int], store: Any, timeout_s: float,
                     where: Mapping[str, Any]) -> CommError:
    """Why the engine ``what`` (split's new one, the collective check's) was abandoned: a member
    (of ``members``, global ranks) failed (``failures``: how each failed rank was seen to fail),
    or the op's deadline passed."""
    failed = failures.keys() & set(members)
    if failed:
        return PeerFailureError(
            f"a member failed while {what} was built",
            failed_ranks=[list(global_ranks).index(g) for g in sorted(failed) if g in global_ranks],
            detected_by=",".join(sorted({failures[g] for g in failed})), **where)
    return CommTimeoutError(
        f"{what} was not ready within {timeout_s:g} s "
        f"(a member never joined its rendezvous{or_store_silent(store)})",
        timeout_s=timeout_s, **where)


def in_flight_error(cause: CommError, where: Mapping[str, Any]) -> CommError:
    """The error of an op still in flight when ``cause`` broke its communicator."""
    if isinstance(cause, PeerFailureError):
        return PeerFailureError("a peer failed while this op was in flight", failed_ranks=cause.failed_ranks,
                                detected_by=cause.detected_by, **where)
    return CommAbortedError(f"communicator broken: {cause}", **where)
