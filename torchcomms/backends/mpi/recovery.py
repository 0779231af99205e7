"""Shrinking an MPI communicator the ULFM way: revoke, ``MPI_Comm_ishrink``, ``MPI_Comm_agree``.

The survivors' communicator is made by MPI itself (no store, no rendezvous): every survivor
revokes the old communicator (so none stays blocked in an op on it), shrinks it to the
processes MPI knows to be alive, and then all agree (``MPI_Comm_agree``, a fault-tolerant
AND) that each of them has the new communicator. A process that fails during the shrink makes
the agreement fail; the survivors then shrink again. Every wait polls and looks at the
deadline, so nothing here blocks past it.
"""
from __future__ import annotations

import array
import time
from typing import Any

from torchcomms.backends.mpi.engine import ULFM_LAUNCH, MpiEngineError, wrap_mpi_error
from torchcomms.backends.mpi.progress import blocking_wait


class ShrinkTimeout(TimeoutError):
    """The survivors' communicator was not agreed on by the deadline."""


def _poll(MPI: Any, request: Any, deadline: float, what: str) -> None:  # noqa: N803
    wait = blocking_wait(MPI, [request], lambda e: wrap_mpi_error(MPI, e))
    if not wait(max(0.0, deadline - time.monotonic())):
        raise ShrinkTimeout(f"{what} did not end before the deadline")


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
        try:
            if not old.Is_revoked():
                old.Revoke()
            new, request = old.Ishrink()
            _poll(MPI, request, deadline, "MPI_Comm_ishrink")
            new.Set_errhandler(MPI.ERRORS_RETURN)
        except MPI.Exception as e:
            raise wrap_mpi_error(MPI, e) from None
        try:
            flag = array.array("i", [1])
            _poll(MPI, new.Iagree(flag), deadline, "MPI_Comm_iagree")
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
