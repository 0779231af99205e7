"""Which thread runs an MPI collective: up to ``mpi.nonblocking_max_bytes`` (64 KiB by default)
MPI's nonblocking call on the caller's thread, above it the blocking call on the engine thread;
mixed sizes keep MPI's one order per communicator."""
from __future__ import annotations

import pytest

from tests.helpers.mpi_ranks import mpi_available, run_mpi_ranks

pytestmark = pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")


@pytest.mark.parametrize(("hints", "small_on_thread"), [
    (None, False),
    ({"mpi.collectives": "blocking"}, True),
], ids=["default", "blocking"])
def test_small_collectives_stay_on_the_callers_thread_by_default(hints: dict[str, str] | None,
                                                                small_on_thread: bool) -> None:
    for rank in run_mpi_ranks(2, "tests.mpi.workers:collective_paths", {"hints": hints}, timeout=120):
        res = rank.value
        assert res["thread_after_small"] is small_on_thread, res
        assert res["thread_after_large"] is True, res
        assert res["sums_ok"] is True, res
