"""Every collective on real ranks of each engine (the ``launch`` fixture: gloo, mpi), against a
locally computed reference."""
from __future__ import annotations

import pytest

from tests.helpers.ranks import run_ranks
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


def test_ops_on_memory_an_earlier_async_op_uses_run_after_it(launch: Launch) -> None:
    """Two all-reduces of one tensor, a slice's then the whole's, an all-reduce then a broadcast:
    the later op sees the earlier one's result (gloo ran both together, MPI too)."""
    for res in launch(3, "tests.torchcomms.workers:ops_on_shared_memory", timeout=120):
        assert res.value == {"all_reduce twice": 0, "a slice, then the whole": 0,
                             "all_reduce, then a sync broadcast": 0}, (res.rank, res.value)


def test_an_op_waiting_for_an_earlier_one_on_its_memory_ends_at_its_own_deadline() -> None:
    results = run_ranks(2, "tests.torchcomms.workers:waits_for_an_earlier_op_within_its_own_deadline", timeout=120)
    got = results[0].value
    assert got["error"] == "CommTimeoutError" and "first" in got, got  # the first ended too (the break)
    assert "did not start within 1 s: it waited for all_reduce #1" in got["message"], got
