"""Which thread runs an MPI collective: MPI's nonblocking call on the caller's thread wherever it
keeps pace with the blocking call (every size for the all-reduce under libnbc's Rabenseifner
algorithm, which torchcomms chooses when it initialises MPI; up to 64 KiB for reduce), else the
blocking call on the engine thread; mixed paths keep MPI's one order per communicator, and every
rank routes alike even when their MPI settings differ."""
from __future__ import annotations

import pytest

from tests.helpers.mpi_ranks import MpiJob, mpi_available, run_mpi_ranks

pytestmark = pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")


@pytest.mark.parametrize(("hints", "small_on_thread", "large_on_thread"), [
    (None, False, False),
    ({"mpi.nonblocking_max_bytes": "65536"}, False, True),
    ({"mpi.collectives": "blocking"}, True, True),
], ids=["default", "bound-64k", "blocking"])
def test_collectives_run_on_the_callers_thread_where_mpi_nonblocking_keeps_pace(
        hints: dict[str, str] | None, small_on_thread: bool, large_on_thread: bool) -> None:
    for rank in run_mpi_ranks(2, "tests.mpi.workers:collective_paths", {"hints": hints, "libnbc_allreduce": ""},
                              timeout=120):
        res = rank.value
        assert res["libnbc_allreduce"] == "3", res  # chosen by torchcomms as it initialised MPI
        assert res["thread_after_small"] is small_on_thread, res
        assert res["thread_after_large"] is large_on_thread, res
        assert res["thread_after_large_reduce"] is True, res
        assert res["sums_ok"] is True, res


def test_ranks_whose_allreduce_algorithms_differ_are_refused_with_the_choices_named() -> None:
    """Rank 1 chose libnbc's binomial all-reduce before MPI started, rank 0 Rabenseifner: their
    nonblocking all-reduces (of any size) would never match, so the first communicator is refused
    on every rank, naming each rank's choice, instead of hanging at the first all-reduce."""
    with MpiJob(2, "tests.mpi.workers:collective_paths", {"libnbc_allreduce": "per-rank"}) as job:
        results = job.wait(120)
    assert len(results) == 2
    for rank in results:
        assert rank.error is not None and rank.error["type"] == "CommValueError", rank
        assert "rank 0: 3, rank 1: 2" in rank.error["message"], rank.error
        assert "coll_libnbc_iallreduce_algorithm" in rank.error["message"], rank.error
