"""The mpi backend under ``torch.distributed`` (the torchcomms route, real MPI ranks)."""
from __future__ import annotations

import pytest

from tests.helpers.mpi_ranks import mpi_available, run_mpi_ranks
from tests.helpers.ports import free_port

pytestmark = pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")


def test_init_process_group_mpi_on_the_route_is_refused_and_cpu_mpi_works() -> None:
    """c10d makes the default group of backend name "mpi" with rank -1 and size -1 (its own MPI
    backend's path): on the route get_rank() was -1 and a new_group's all_reduce changed nothing.
    It is refused, naming the way that works, which does."""
    results = run_mpi_ranks(2, "tests.mpi.workers:process_group_on_the_route", {"port": free_port()},
                            timeout=120, pool=False)
    for res in results:
        v = res.value
        assert v["mpi"].startswith("CommValueError") and "'cpu:mpi'" in v["mpi"], v
        assert v["cpu:mpi"] == [res.rank, 2, [2.0, 2.0]], v
