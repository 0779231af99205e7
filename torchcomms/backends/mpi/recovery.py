"""Shrinking an MPI communicator the ULFM way (revoke, ``MPI_Comm_shrink``, ``MPI_Comm_agree``),
and the outcome agreement of ``TorchComm.agree`` on ``MPI_Comm_iagree``.

The survivors' communicator is made by MPI itself (no store, no rendezvous): every survivor
revokes the old communicator (so none stays blocked in an op on it), shrinks it to the
processes MPI knows to be alive, and then all agree (``MPI_Comm_agree``, a fault-tolerant
AND) that each of them has the new communicator. A process that fails during the shrink makes
the agreement fail; the survivors then shrink again. Open MPI 5.0's ``MPI_Comm_ishrink`` fails
with ``MPI_ERR_INTERN`` where the blocking ``MPI_Comm_shrink`` works, so the blocking calls run
on a thread of their own and the caller waits for it until the deadline, never past it (a
thread still blocked then is abandoned).
"""
from __future__ import annotations

import array
import threading
import time
from collections.abc import Callable
from typing import Any

from torchcomms.backends.mpi.engine import ULFM_LAUNCH, MpiEngineError, peer_failure_classes, wrap_mpi_error

#: polls of a pending agreement before its waiter starts sleeping between polls
_AGREE_SPIN_POLLS = 1000
_AGREE_NAP_S = 0.0001


class ShrinkTimeout(TimeoutError):
    """The survivors' communicator was not agreed on by the deadline."""


class AgreementTimeout(TimeoutError):
    """``MPI_Comm_iagree`` did not end by the deadline."""


def agree_flag(MPI: Any, comm: Any, flag: bool, deadline: float, keep: list[Any]) -> bool:  # noqa: N803
    """The AND of ``flag`` over the processes of ``comm`` that are alive (``MPI_Comm_iagree``),
    the same on every one of them; it works on a revoked communicator too.

    ULFM writes the agreed value even when it also reports a failed process
    (``MPI_ERR_PROC_FAILED``): the value is what was agreed, so that report is not an error here.
    The request is polled, never waited for in MPI, until ``deadline`` (then
    ``AgreementTimeout``; the request and its buffer go to ``keep``, as MPI may still write it).
    Other MPI errors are raised as ``MpiEngineError``."""
    buf = array.array("i", [1 if flag else 0])
    try:
        req = comm.Iagree(buf)
    except MPI.Exception as e:
        raise wrap_mpi_error(MPI, e) from None
    failed = peer_failure_classes(MPI)
    polls = 0
    while True:
        try:
            if req.Test():
                break
        except MPI.Exception as e:
            if e.Get_error_class() not in failed:
                raise wrap_mpi_error(MPI, e) from None
            break  # a process failed: the survivors still agreed on buf
        polls += 1
        if polls > _AGREE_SPIN_POLLS:
            if time.monotonic() >= deadline:
                keep.append((req, buf))
                raise AgreementTimeout("MPI_Comm_iagree did not end before the deadline")
            time.sleep(_AGREE_NAP_S)
    return bool(buf[0])


def _bounded(MPI: Any, call: Callable[[], Any], deadline: float, what: str) -> Any:  # noqa: N803
    """``call()`` on a thread of its own, waited for until ``deadline``; its MPI error as an
    ``MpiEngineError``, ``ShrinkTimeout`` at the deadline."""
    box: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box.append((False, e))
        done.set()

    threading.Thread(target=run, name=f"torchcomms-mpi-{what}", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        raise ShrinkTimeout(f"{what} did not end before the deadline")
    ok, value = box[0]
    if ok:
        return value
    if isinstance(value, MPI.Exception):
        raise wrap_mpi_error(MPI, value) from None
    raise value


def shrink_comm(MPI: Any, comm: Any, ft: bool, global_ranks: list[int], deadline: float) -> tuple[Any, list[int]]:  # noqa: N803
    """(the survivors' communicator, their job ranks in their new rank order).

    Raises ``MpiEngineError`` (kind ``"other"``) when the MPI runs without ULFM, naming the
    launch that provides it, and ``ShrinkTimeout`` at ``deadline``."""
    if not ft:
        raise MpiEngineError(
            f"shrink needs ULFM fault tolerance, and this MPI job runs without it: launch with '{ULFM_LAUNCH}' "
            "(Open MPI 5); MPICH's ULFM is not usable")
    old = comm
    while True:
        def shrink(old: Any = old) -> Any:
            if not old.Is_revoked():
                old.Revoke()
            new = old.Shrink()
            new.Set_errhandler(MPI.ERRORS_RETURN)
            return new

        new = _bounded(MPI, shrink, deadline, "MPI_Comm_shrink")
        try:
            _bounded(MPI, lambda: new.Agree(1), deadline, "MPI_Comm_agree")
            break  # every survivor has the new communicator
        except MpiEngineError as e:
            if e.kind != "peer" or time.monotonic() >= deadline:
                raise
            old = new  # a survivor failed meanwhile: shrink what is left
    group, old_group = new.Get_group(), comm.Get_group()
    try:
        old_ranks = MPI.Group.Translate_ranks(group, list(range(new.Get_size())), old_group)
    finally:
        group.Free()
        old_group.Free()
    return new, [global_ranks[r] for r in old_ranks]
