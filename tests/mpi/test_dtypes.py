"""Every dtype the mpi backend declares, with every reduce op it allows, on real MPI ranks
(float16/bfloat16 reduce through the backend's user-defined MPI ops; bool through MPI's
logical ops)."""
from __future__ import annotations

import pytest

from tests.helpers.mpi_ranks import mpi_available, run_mpi_ranks

pytestmark = pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")


#: the two ways a collective runs: MPI's blocking call on the engine thread, or its nonblocking
#: call polled on the caller's thread (a communicator of each in one job)
PATHS = {"engine-thread": {"mpi.collectives": "blocking"}, "caller-thread": {"mpi.nonblocking_max_bytes": "262144"}}


@pytest.mark.parametrize("world", [2, 3])
def test_every_declared_dtype_reduces_correctly(world: int) -> None:
    for res in run_mpi_ranks(world, "tests.mpi.workers:dtype_reductions", {"paths": PATHS}, timeout=180):
        for path in PATHS:
            got = res.value[path]
            assert got["failures"] == [], (path, got["failures"][:5])
            assert got["checks"] >= 60, (path, got["checks"])


def test_counts_past_mpis_int_limit_are_refused_with_a_value_error() -> None:
    for res in run_mpi_ranks(2, "tests.mpi.workers:counts_past_int_max", timeout=180):
        v = res.value
        assert v.pop("sum_after") == [2.0] * 4, v
        for op, got in v.items():
            assert got.startswith("CommValueError") and "2147483656 elements" in got and "2147483647" in got, (op, got)


def test_a_completed_ops_tensor_is_not_kept_alive_by_the_communicator() -> None:
    """A receive stayed referenced as its source's latest receive (a pipeline stage's activation
    buffer lived until the next receive from that peer), and the progress thread kept the last
    async op's buffers while it waited for the next op."""
    results = run_mpi_ranks(2, "tests.mpi.workers:buffers_released_after_ops", timeout=120)
    alive = {res.rank: [case for case, kept in res.value.items() if kept] for res in results}
    assert alive == {0: [], 1: []}, alive
