"""Every dtype the mpi backend declares, with every reduce op it allows, on real MPI ranks
(float16/bfloat16 reduce through the backend's user-defined MPI ops; bool through MPI's
logical ops)."""
from __future__ import annotations

import pytest

from tests.helpers.mpi_ranks import mpi_available, run_mpi_ranks

pytestmark = pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")


@pytest.mark.parametrize("hints", [{"mpi.collectives": "blocking"}, {"mpi.nonblocking_max_bytes": "262144"}],
                         ids=["engine-thread", "caller-thread"])
@pytest.mark.parametrize("world", [2, 3])
def test_every_declared_dtype_reduces_correctly(world: int, hints: dict[str, str] | None) -> None:
    for res in run_mpi_ranks(world, "tests.mpi.workers:dtype_reductions", {"hints": hints}, timeout=180):
        assert res.value["failures"] == [], res.value["failures"][:5]
        assert res.value["checks"] >= 60
