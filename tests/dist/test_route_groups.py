"""Groups made through ``torch.distributed`` on the route (TORCH_DISTRIBUTED_USE_TORCHCOMMS=1).

``new_group([0, 5])`` on two ranks: rank 0 (a member) raised CommValueError before the split
collective, while rank 1 (left out; torch's path for it calls ``comm.split([])``) waited in it
until the timeout, and the world communicator was broken (every later op: CommAbortedError).
c10d's gloo raises ValueError on every rank and carries on."""
from __future__ import annotations

import pytest

from tests.helpers.ranks import run_ranks
from tests.helpers.torch_versions import TORCH_2_13

ROUTE = {"TORCH_DISTRIBUTED_USE_TORCHCOMMS": "1", "TORCHCOMM_ABORT_ON_ERROR": "0"}


@pytest.mark.parametrize("ranks", [[0, 5], [-1, 0]])
def test_a_member_list_with_a_rank_out_of_range_is_refused_and_the_world_goes_on(ranks: list[int]) -> None:
    results = run_ranks(2, "tests.dist.group_workers:bad_member_list", {"ranks": ranks}, timeout=120, env=ROUTE)
    r0, r1 = (res.value for res in results)
    if not TORCH_2_13:  # 2.11's new_group checks the ranks itself, on every rank, before any split
        assert r0["new_group"] == r1["new_group"] == "ValueError", (r0, r1)
    else:
        assert r0["new_group"] == "CommValueError" and "ValueError" in r0["mro"], r0
        assert r1["new_group"] == "non-member", r1
    assert r0["after"] == [2.0, 2.0] and r1["after"] == [2.0, 2.0]
