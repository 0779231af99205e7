"""The collective steps of making an MPI communicator, bounded by its creation's timeout.

Each step (the all-gather of the ranks' libnbc choices, ``MPI_Comm_idup``, the comparison of the
ranks' path hints) is MPI's nonblocking call polled until one deadline: a rank that does not make
the communicator (stopped, failed without ULFM, or making its communicators in another order)
must not hold the others past ``new_comm``'s timeout. A step given up on is kept with its buffers
and fails as a timeout. On Open MPI 5, MPI completes it once the late rank comes, so the ranks'
later communicators still match in order; Open MPI 4.1's ``MPI_Comm_idup`` given up on does not
match the late rank's, and the ranks' next creation times out as well (measured on the GPU host,
``tests/mpi/test_failures.py``).
"""
from __future__ import annotations

import array
import time
from collections.abc import Callable
from typing import Any

from torchcomms.backends import check_mode
from torchcomms.backends.mpi.engine import MpiEngineError
from torchcomms.backends.mpi.hints import CollectivePaths, describe_signature, path_signature, paths_differ
from torchcomms.backends.mpi.progress import blocking_wait
from torchcomms.errors import CommValueError


class CreationSteps:
    """The steps of making one communicator: ``on_error`` wraps an MPI error (the backend's),
    ``abandoned`` keeps what is given up on, ``ft``: the job runs with ULFM."""

    def __init__(self, MPI: Any, name: str, timeout_s: float, ft: bool,  # noqa: N803
                 on_error: Callable[[BaseException], BaseException], abandoned: list[Any]) -> None:
        self.MPI = MPI
        self.name = name
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.ft = ft
        self._on_error = on_error
        self._abandoned = abandoned

    def start(self, call: Callable[[], Any], parent: Any) -> Any:
        """``call()`` (a step's nonblocking MPI call on ``parent``), its MPI error typed."""
        try:
            return call()
        except self.MPI.Exception as e:
            raise self.error(e, parent) from None

    def wait(self, req: Any, keep: Any, what: str, parent: Any) -> None:
        """Poll ``req`` (a step ``what`` on ``parent``) until the deadline; past it the request and
        ``keep`` (its buffers) are abandoned and the step fails as a timeout."""
        if blocking_wait(self.MPI, [req], lambda e: self.error(e, parent))(max(0.0, self.deadline - time.monotonic())):
            return
        self._abandoned.append((req, keep))
        raise MpiEngineError(
            f"{what} did not complete within {self.timeout_s:g} s: a rank has not created this communicator (every "
            "rank creates its communicators in the same order; a stopped or failed rank never does)", kind="timeout")

    def error(self, error: BaseException, parent: Any) -> BaseException:
        """The error of a step on ``parent``. Under ULFM a failed process of ``parent`` makes it a
        peer failure, whatever MPI's error class (Open MPI 5.0's ``MPI_Comm_idup`` reports one as
        ``MPI_ERR_INTERN``)."""
        wrapped = self._on_error(error)
        if not self.ft or getattr(wrapped, "kind", "") == "peer":
            return wrapped
        try:
            group = parent.Get_failed()
            failed = group.Get_size()
            group.Free()
        except Exception:  # noqa: BLE001 - no ULFM query here
            return wrapped
        if not failed:
            return wrapped
        return MpiEngineError(
            f"{failed} process(es) of the MPI job failed (reported by ULFM), so this communicator cannot be made over "
            f"them ({wrapped}); shrink a communicator that had them, or make this one over the survivors",
            getattr(wrapped, "error_class", None), "peer")

    def agree_on_paths(self, comm: Any, hints: dict[str, str], allreduce_keeps_pace: bool,
                       agreed: bool) -> CollectivePaths:
        """``comm``'s collective paths (:mod:`.hints`), compared across its ranks (collective, as
        its creation is; skipped when ``agreed`` already, as by a shrink's parent): MPI's
        nonblocking collectives never match its blocking ones, so ranks whose hints route an op
        differently would hang in it until its deadline. Raises ``CommValueError`` on every
        rank, naming each rank's hints, instead; likewise when the ranks disagree on the
        collective check (:mod:`torchcomms.backends.check_mode`), compared in the same exchange."""
        MPI = self.MPI  # noqa: N806
        sig, paths, invalid = path_signature(hints, self.name, allreduce_keeps_pace)
        if agreed and paths is not None:
            return paths
        sig.append(int(check_mode.enabled(hints)))
        n = comm.Get_size()
        every = array.array("q", [0]) * (len(sig) * n)
        mine = array.array("q", sig)
        req = self.start(lambda: comm.Iallgather([mine, MPI.INT64_T], [every, MPI.INT64_T]), comm)
        self.wait(req, (mine, every), "the ranks' comparison of their hints", comm)
        if invalid is not None:
            raise invalid
        sigs = [list(every[i * len(sig):(i + 1) * len(sig) - 1]) for i in range(n)]
        mixed = check_mode.disagreement([bool(every[(i + 1) * len(sig) - 1]) for i in range(n)], self.name)
        if mixed is not None:
            raise mixed
        if paths_differ(sigs):
            shown = ", ".join(f"rank {r}: {describe_signature(s)}" for r, s in enumerate(sigs))
            raise CommValueError(
                f"the ranks' hints route collectives differently ({shown}); MPI's nonblocking collectives never "
                "match its blocking ones, so every rank must pass the same mpi.collectives and "
                "mpi.nonblocking_max_bytes hints", comm=self.name, op="new_comm")
        assert paths is not None
        return paths
