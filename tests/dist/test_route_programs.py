"""Unchanged torch.distributed programs (DDP, FSDP2, ZeRO, a 2-D DeviceMesh with DTensor tensor
parallel) with TORCH_DISTRIBUTED_USE_TORCHCOMMS=1: same numbers as on c10d's gloo, and the
traffic went through our communicators; a dead peer surfaces as our typed error."""
from __future__ import annotations

import pytest

from tests.dist.route_runs import ROUTE, on_and_off
from tests.helpers.torch_versions import TORCH_2_13

# torch 2.13 makes a subgroup by splitting the default group's communicator (a "split" op of it);
# 2.11's new_group makes a communicator of its own for it.


def _close(a: list, b: list, tol: float = 1e-6) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


@pytest.mark.parametrize("program,world,ops", [
    ("ddp", 2, ("all_reduce", "broadcast")),
    ("fsdp2", 2, ("all_gather_single", "reduce_scatter_single")),
    ("mesh_2d", 4, ("all_gather_single", "reduce_scatter_single", "all_reduce") + (("split",) if TORCH_2_13 else ())),
])
def test_program_same_numbers_and_routed(program: str, world: int, ops: tuple[str, ...]) -> None:
    on, off = on_and_off(world, f"tests.dist.route_workers:{program}", timeout=300)
    for a, b in zip(on, off):
        assert _close(a.value["losses"], b.value["losses"]), (a.value["losses"], b.value["losses"])
        assert _close(a.value["params"], b.value["params"])
        assert b.value["recorded"] == {}
        rec = a.value["recorded"]
        for op in ops:
            assert any(k.endswith(":" + op) for k in rec), f"rank {a.rank}: no {op} in {rec}"
    if program == "mesh_2d":
        for res in on:
            assert res.value["backends"] == ["_BackendWrapper"]
            assert res.value["groups"] == off[res.rank].value["groups"]


def test_zero_consolidated_state_same_as_c10d() -> None:
    # ZeroRedundancyOptimizer's consolidate_state_dict: every rank's shard broadcast from its
    # owner (a length, then the pickled bytes), kept on the target rank (1 of 3)
    on, off = on_and_off(3, "tests.dist.route_workers:zero", timeout=300)
    for a, b in zip(on, off):
        assert _close(a.value["losses"], b.value["losses"]) and _close(a.value["params"], b.value["params"])
        assert a.value["state"] == b.value["state"], (a.rank, a.value["state"], b.value["state"])
        assert (a.value["state"] is not None) == (a.rank == 1)
        assert a.value["recorded"].get("gloo:broadcast", 0) >= 3 and b.value["recorded"] == {}
    state = on[1].value["state"]
    assert sorted(state["state"]) == ["0", "1", "2", "3"] and [g["lr"] for g in state["param_groups"]] == [0.01, 0.05]


def test_dead_peer_raises_our_typed_error_through_torch_distributed() -> None:
    from tests.helpers.ranks import RankGroup

    env = dict(ROUTE, TORCHCOMM_TIMEOUT_SECONDS="30")
    with RankGroup(2, "tests.dist.route_workers:dead_peer", env=env) as g:
        results = g.wait(120, failed_grace=60)
    r0 = results[0]
    assert r0.returncode == 0, r0.stderr[-2000:]
    v = r0.value
    assert v["error"] is not None, v
    assert "CommError" in v["mro"], v
    assert v["error"] in ("PeerFailureError", "CommTimeoutError", "CommAbortedError"), v
    assert v["secs"] < 60


@pytest.mark.parametrize("victim", [0, 2])  # rank 0 also hosts init_process_group's TCPStore
def test_a_rank_killed_mid_all_reduce_fails_the_survivors_op(victim: int) -> None:
    from tests.helpers.ranks import RankGroup

    env = dict(ROUTE, TORCHCOMM_TIMEOUT_SECONDS="60")
    with RankGroup(3, "tests.dist.route_workers:killed_mid_all_reduce", {"victim": victim}, env=env) as g:
        results = g.wait(120, failed_grace=60)
    assert results[victim].returncode == -9
    for res in results:
        if res.rank != victim:
            v = res.value
            assert v["error"] == "PeerFailureError" and "CommError" in v["mro"] and v["steps"] >= 3, v
            assert v["after"] == "CommAbortedError", v
