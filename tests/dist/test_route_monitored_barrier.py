"""``torch.distributed.monitored_barrier`` on the route (TORCH_DISTRIBUTED_USE_TORCHCOMMS=1).

c10d's gloo has it; the route raised "Backend gloo does not support monitoredBarrier" (our
c10d backend did not implement it). Now: gloo's algorithm on the communicator's send/recv,
raising our ``CommTimeoutError`` (a ``RuntimeError``) with c10d's words and the missing ranks."""
from __future__ import annotations

import pytest

from tests.dist.route_runs import ROUTE
from tests.helpers.ranks import run_ranks



@pytest.mark.parametrize("wait_all_ranks", [True, False])
def test_monitored_barrier_passes_and_names_the_ranks_that_never_came(wait_all_ranks: bool) -> None:
    results = run_ranks(3, "tests.dist.barrier_workers:monitored", {"wait_all_ranks": wait_all_ranks},
                        timeout=180, env=ROUTE)
    assert all(res.value["sum"] == [3.0, 3.0] for res in results)
    v = results[0].value
    assert v["error"] == "CommTimeoutError" and "RuntimeError" in v["mro"], v
    if wait_all_ranks:
        assert v["missing"] == [1, 2] and "Ranks 1, 2 failed to pass monitoredBarrier in 3000 ms" in v["message"], v
    else:
        assert v["missing"] == [1] and "Rank 1 failed to pass monitoredBarrier in 3000 ms" in v["message"], v
