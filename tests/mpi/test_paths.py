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
    # a job of its own (not the rank pool's, whose ranks initialised MPI before their first
    # target): the target unsets the libnbc choice before MPI starts, to see torchcomms make it
    for rank in run_mpi_ranks(2, "tests.mpi.workers:collective_paths", {"hints": hints, "libnbc_allreduce": ""},
                              timeout=120, pool=False):
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


@pytest.mark.parametrize(("hints", "split_hints", "named"), [
    ({"0": {"mpi.collectives": "blocking"}, "1": {}}, None, "rank 0: mpi.collectives=blocking, rank 1: no path hint"),
    ({"0": {"mpi.nonblocking_max_bytes": "8"}, "1": {"mpi.nonblocking_max_bytes": "1024"}}, None,
     "rank 0: mpi.nonblocking_max_bytes=8, rank 1: mpi.nonblocking_max_bytes=1024"),
    ({"0": {"mpi.collectives": "sometimes"}, "1": {}}, None, "mpi.collectives='sometimes'"),
    ({"0": {"mpi.nonblocking_max_bytes": "\u00b2"}, "1": {"mpi.nonblocking_max_bytes": "\u00b2"}}, None,
     "mpi.nonblocking_max_bytes='\u00b2'"),
    ({"0": {"mpi.colectives": "blocking"}, "1": {}}, None, "unknown hint(s) mpi.colectives"),
    ({"0": {}, "1": {}}, {"0": {}, "1": {"mpi.collectives": "blocking"}},
     "rank 0: no path hint, rank 1: mpi.collectives=blocking"),
    # before: the checking rank waited at the check's engine, the other in the all_reduce, until its deadline
    ({"0": {"torchcomms.check_collectives": "1"}, "1": {}}, None,
     "the ranks disagree on the collective check: on at rank 0, off at rank 1"),
], ids=["mode", "bound", "invalid-on-one", "non-ascii-digit", "misspelt-on-one", "split", "check"])
def test_ranks_whose_path_hints_differ_are_refused_at_creation_with_each_named(
        hints: dict, split_hints: dict | None, named: str) -> None:
    """MPI's nonblocking collectives never match its blocking ones: ranks routing one op
    differently hung until the op's deadline ('did not complete within 20 s'). The communicator
    is refused at creation on every rank instead (a rank whose hint is invalid names it; the
    others must not wait for it)."""
    results = run_mpi_ranks(2, "tests.mpi.workers:hints_per_rank", {"hints": hints, "split_hints": split_hints},
                            timeout=120)
    for res in results:
        assert res.value.startswith("CommValueError"), res.value
    assert any(named in res.value for res in results), [res.value for res in results]


def test_a_byte_bound_past_every_size_routes_every_collective_nonblocking() -> None:
    """A bound too large for the 64-bit words the ranks compare is a bound above every size
    (it raised OverflowError inside the comparison, a BackendError, before)."""
    huge = {"mpi.nonblocking_max_bytes": str(10**30)}
    results = run_mpi_ranks(2, "tests.mpi.workers:hints_per_rank", {"hints": {"0": huge, "1": huge}}, timeout=120)
    assert [res.value for res in results] == ["ok", "ok"]
