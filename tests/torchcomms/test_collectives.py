"""Every collective on real ranks of each engine (the ``launch`` fixture: gloo, mpi), against a
locally computed reference."""
from __future__ import annotations

import pytest

from tests.torchcomms.conftest import Launch


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_collective_matrix(world: int, launch: Launch) -> None:
    """Each op issued synchronously, then asynchronously (waited on), in one job."""
    results = launch(world, "tests.torchcomms.workers:collective_matrix", timeout=240)
    for res in results:
        for mode in ("sync", "async"):
            got = res.value[mode]
            assert got["failures"] == [], f"rank {res.rank}, {mode}: {got['failures'][:5]}"
            assert got["checks"] > 100, (mode, got["checks"])


@pytest.mark.parametrize("world", [2, 3, 4])
def test_split(world: int, launch: Launch) -> None:
    results = launch(world, "tests.torchcomms.workers:split_behaviour", timeout=120)
    for res in results:
        v = res.value
        r = res.rank
        mine = [q for q in range(world) if q % 2 == r % 2]
        assert v["sub_rank"] == mine.index(r)
        assert v["sub_size"] == len(mine)
        assert v["sub_sum"] == float(sum(mine))
        assert v["global_ranks"] == mine
        assert v["only0_is_none"] == (r != 0)
        if r == 0:
            assert v["only0_sum"] == 5.0
        assert v["rev_rank"] == world - 1 - r
        assert v["rev_root_value"] == float(world - 1)
        assert v["mismatch"] is not None and "CollectiveMismatch" not in v["mismatch"]
        assert "passed ranks" in v["mismatch"]
        # split is an op of the parent: it takes sequence numbers like any collective
        assert v["parent_ops"].count("split") == 4
        assert v["parent_seqs"] == sorted(v["parent_seqs"])
        assert v.get("impl_types", [True]) == [True] * len(v.get("impl_types", [True]))
        # a rank's refused arguments: it raises its own error, the others CollectiveMismatchError
        # naming it, at once (they waited for it until the timeout, breaking the parent)
        refusers = {"duplicates": 0, "out of range": 0, "without self": world - 1}
        for case, got in v["refused"].items():
            if r == refusers[case]:
                assert got.startswith("CommValueError"), (case, got)
            else:
                assert got.startswith("CollectiveMismatchError") and f"[{refusers[case]}]" in got, (case, got)
        assert v["sum_after_refusals"] == float(world)
