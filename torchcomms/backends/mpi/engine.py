"""The MPI library itself: loading mpi4py, what the MPI can do (ULFM), and its errors.

mpi4py initialises MPI when ``mpi4py.MPI`` is first imported, so nothing here imports it at
module level: ``import torchcomms`` never starts MPI, only the first MPI communicator does
(with ``MPI_THREAD_MULTIPLE``: the caller's thread and the request-progress thread both call
into MPI).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

#: How to launch with fault tolerance, for messages about what the MPI lacks.
ULFM_LAUNCH = "mpiexec --with-ft ulfm"
#: Open MPI's choice of nonblocking all-reduce algorithm (libnbc), read once at ``MPI_Init``.
#: libnbc's own choice at 2 ranks (binomial) took 1.8-2.6x as long as the blocking
#: ``MPI_Allreduce`` from 64 KiB to 16 MiB; its Rabenseifner (3) and ring (1) kept pace with it
#: (0.99-1.05x at 2 and 4 ranks; ``benchmarks/diagnostics/mpi_nonblocking_algorithms.py``), so
#: torchcomms asks for Rabenseifner unless the job set its own choice.
LIBNBC_ALLREDUCE_VAR = "OMPI_MCA_coll_libnbc_iallreduce_algorithm"
LIBNBC_ALLREDUCE_DEFAULT = "3"
_FAST_LIBNBC_ALLREDUCE = ("1", "3")  # ring, Rabenseifner
#: Open MPI's switch that leaves out the PMIx fence which begins ``MPI_Finalize``. In a ULFM job
#: whose ranks met a failed process, that fence never completed on 9 of 49 runs (Open MPI 5.0.11,
#: bare mpi4py, 3-4 ranks, one SIGKILLed: a failed ``MPI_Iallgather``, revoke, with or without
#: shrink, then exit; every survivor waited in ``MPI_Finalize`` forever, and so did the job), and
#: never with the switch on (0 of 35), so torchcomms turns it on in ULFM jobs unless the job set it.
ASYNC_FINALIZE_VAR = "OMPI_MCA_async_mpi_finalize"


def mpi4py_installed() -> bool:
    """True when mpi4py can be imported (checked without initialising MPI)."""
    return importlib.util.find_spec("mpi4py") is not None


def load_mpi() -> Any:
    """The ``mpi4py.MPI`` module, MPI initialised with thread level ``MPI_THREAD_MULTIPLE`` (and,
    when this is what initialises it, libnbc's Rabenseifner all-reduce unless the job chose one,
    and in a ULFM job no fence at ``MPI_Finalize`` unless the job chose one: see
    :data:`ASYNC_FINALIZE_VAR`)."""
    import mpi4py

    if not getattr(load_mpi, "_configured", False):
        mpi4py.rc.thread_level = "multiple"
        if "mpi4py.MPI" not in sys.modules:  # MPI not initialised yet: its parameters can still be set
            os.environ.setdefault(LIBNBC_ALLREDUCE_VAR, LIBNBC_ALLREDUCE_DEFAULT)
            if ft_requested():
                os.environ.setdefault(ASYNC_FINALIZE_VAR, "1")
        load_mpi._configured = True  # type: ignore[attr-defined]
    from mpi4py import MPI

    return MPI


def libnbc_allreduce_choice() -> int:
    """This process's choice of libnbc all-reduce algorithm (0: libnbc decides, -1: unreadable)."""
    raw = os.environ.get(LIBNBC_ALLREDUCE_VAR, "0").strip() or "0"
    return int(raw) if raw.isdigit() else -1


def nonblocking_allreduce_keeps_pace(MPI: Any, choice: int) -> bool:  # noqa: N803
    """True when a nonblocking all-reduce under libnbc algorithm ``choice`` is one measured as fast
    as the blocking call at every size: Open MPI with libnbc's ring or Rabenseifner algorithm."""
    return MPI.Get_library_version().startswith("Open MPI") and str(choice) in _FAST_LIBNBC_ALLREDUCE


def thread_level_ok(MPI: Any) -> bool:  # noqa: N803 - the module's own name
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


def ulfm_enabled(MPI: Any) -> bool:  # noqa: N803
    """True when this MPI has ULFM and the job was launched with it on.

    Open MPI 5 ships ULFM but turns it on only under ``mpiexec --with-ft ulfm``, which sets
    ``OMPI_MCA_mpi_ft_enable=1``; without it a failed process takes the whole job down."""
    return hasattr(MPI.Comm, "Ishrink") and hasattr(MPI, "ERR_PROC_FAILED") and ft_requested()


def ft_requested() -> bool:
    """True when the job was launched with ULFM on (``mpiexec --with-ft ulfm`` sets
    ``OMPI_MCA_mpi_ft_enable=1``), whether or not this MPI has it."""
    flag = os.environ.get("OMPI_MCA_mpi_ft_enable", "")
    return flag.strip().lower() in ("1", "true", "yes", "on", "enabled")


def library_version(MPI: Any) -> str:  # noqa: N803
    import mpi4py

    first = MPI.Get_library_version().strip().splitlines()[0].split(",")[0]
    return f"{first} (mpi4py {mpi4py.__version__})"


class MpiEngineError(RuntimeError):
    """An MPI call failed. ``error_class`` is MPI's error class (``MPI.ERR_*``) or ``None``;
    ``kind`` is what the communicator makes of it: ``"peer"``, ``"mismatch"`` or ``"other"``."""

    def __init__(self, message: str, error_class: int | None = None, kind: str = "other") -> None:
        super().__init__(message)
        self.error_class = error_class
        self.kind = kind


def peer_failure_classes(MPI: Any) -> frozenset[int]:  # noqa: N803
    """The error classes by which ULFM reports a failed peer (or a communicator revoked because of one)."""
    names = ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
    return frozenset(getattr(MPI, n) for n in names if hasattr(MPI, n))


#: MPI_ERR_TRUNCATE in a collective: a peer's message was longer than this rank's buffer
_TRUNCATED = (
    "a message of this collective was longer than this rank's buffer: the ranks called it with different sizes or "
    "dtypes ({} (MPI error class {})). Above its eager size Open MPI has already written the message past the "
    "buffer, so this process may not be safe to go on; TORCHCOMM_CHECK_COLLECTIVES=1 compares every rank's call "
    "before any data moves and names each rank's call")


def wrap_mpi_error(MPI: Any, error: BaseException) -> MpiEngineError:  # noqa: N803
    """An ``MpiEngineError`` naming MPI's error class and saying whether a peer failed."""
    if isinstance(error, MpiEngineError):
        return error
    if isinstance(error, MPI.Exception):
        cls = error.Get_error_class()
        if cls == MPI.ERR_TRUNCATE:
            return MpiEngineError(_TRUNCATED.format(error.Get_error_string(), cls), cls, "mismatch")
        peer = cls in peer_failure_classes(MPI)
        what = "a peer process failed (reported by ULFM)" if peer else "the MPI call failed"
        return MpiEngineError(f"{what}: {error.Get_error_string()} (MPI error class {cls})", cls,
                              "peer" if peer else "other")
    return MpiEngineError(f"{type(error).__name__}: {error}")
