"""Every c10d op through torch.distributed on our communicators (TORCH_DISTRIBUTED_USE_TORCHCOMMS=1),
against values computed locally, and the same program on c10d's own gloo."""
from __future__ import annotations

import pytest

from tests.dist.route_runs import ROUTE
from tests.helpers.ranks import run_ranks
from tests.helpers.torch_versions import TORCH_2_13

#: ops c10d's own gloo backend refuses (the route implements them on the communicator)
GLOO_GAPS = ("all_reduce/avg", "all_reduce/premul_sum", "reduce_scatter/avg", "reduce_scatter_tensor/avg",
             "all_reduce/band", "all_reduce/bor", "all_reduce/bxor",
             "all_gather_into_tensor/stacked",  # an (n, k) output
             "split_group/")  # c10d needs a device bound to the default group to split
if not TORCH_2_13:
    GLOO_GAPS += ("all_to_all:",)  # c10d's gloo has no list all-to-all before 2.13 (INTERNALS, "Torch versions")


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_op_through_the_route(world: int) -> None:
    results = run_ranks(world, "tests.dist.op_workers:every_op", timeout=300, env=ROUTE)
    for res in results:
        v = res.value
        assert v["routed"] and v["backend"] == "_BackendWrapper"
        assert v["failures"] == [], f"rank {res.rank}: {v['failures'][:5]}"
        assert v["unsupported"] == [], f"rank {res.rank}: {v['unsupported'][:5]}"
        assert v["checks"] >= 95
        # the traffic went through the communicator's dispatch path (its flight recorder saw it)
        rec = v["recorded"]
        for op in ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_single", "reduce_scatter",
                   "reduce_scatter_single", "all_to_all_single", "all_to_all_v_single", "all_to_all", "barrier",
                   "gather", "scatter", "split"):
            assert any(k.endswith(":" + op) for k in rec), f"rank {res.rank}: no {op} in {sorted(rec)}"
        for op in ("send ", "recv ", "coalesced"):  # p2p names carry the peers: "gloo:send 0->1"
            assert any(":" + op in k for k in rec), f"rank {res.rank}: no {op} in {sorted(rec)}"


def test_same_numbers_without_the_route() -> None:
    """c10d's gloo gives the same values wherever it supports the op."""
    results = run_ranks(2, "tests.dist.op_workers:every_op", timeout=300)
    for res in results:
        v = res.value
        assert not v["routed"]
        assert v["failures"] == [], f"rank {res.rank}: {v['failures'][:5]}"
        gaps = [u for u in v["unsupported"] if not u.startswith(GLOO_GAPS)]
        assert gaps == [], gaps


def test_a_subgroup_made_by_c10ds_helper_has_the_groups_ranks() -> None:
    # c10d's process-group helper (torch 2.11's new_group) passes new_comm a name and a store
    # only: the communicator took the job's rank and size from the environment, and the two
    # members waited in their rendezvous for the third rank until the timeout
    env = dict(ROUTE, TORCHCOMM_TIMEOUT_SECONDS="20")
    results = run_ranks(3, "tests.dist.route_workers:subgroup_made_by_c10d_helper", timeout=120, env=env)
    for res in results:
        v = res.value
        assert v["world"] == 3.0, v
        if res.rank < 2:
            assert v["member"] and v["sum"] == [3.0, 3.0] and (v["rank"], v["size"]) == (res.rank, 2), v
        else:
            assert not v["member"], v
