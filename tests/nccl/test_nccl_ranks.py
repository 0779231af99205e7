"""Rank processes on GPUs: a peer that never joins (one GPU), and N-GPU correctness, timeout
and shrink (skipped with fewer GPUs: NCCL allows one rank per GPU)."""
from __future__ import annotations

import pytest

from tests.helpers.ranks import RankGroup, run_ranks
from tests.nccl.conftest import gpus, needs_gpu, needs_gpus

pytestmark = [pytest.mark.gpu, needs_gpu]


def test_peer_never_joins_raises_in_time_and_the_process_goes_on() -> None:
    timeout_s = 3.0
    [res] = run_ranks(1, "tests.nccl.workers:peer_never_joins", {"timeout_s": timeout_s}, timeout=90)
    v = res.value
    assert v["raised"] == "CommTimeoutError"
    assert v["elapsed"] <= timeout_s + 1.0, v
    assert v["after"] == [5.0] * 4


@needs_gpus(2)
def test_every_op_on_every_gpu() -> None:
    run_ranks(gpus(), "tests.nccl.workers:every_op", timeout=180)


@needs_gpus(2)
def test_op_timeout_then_shrink_to_survivors() -> None:
    n = gpus()
    with RankGroup(n, "tests.nccl.workers:op_timeout_then_shrink", {"straggler": n - 1}) as g:
        results = g.wait(180)
    survivors = [r for r in results if r.rank != n - 1]
    for r in survivors:
        assert r.ok(), (r.error, r.stderr[-3000:])
        assert r.value["timeout_elapsed"] <= 2.0 + 1.0
        assert r.value["new_size"] == n - 1 and r.value["sum"] == n - 1
