"""The split of a step's global batch over the live ranks of elastic HSDP, and the make-up
passes after replicas are lost in the middle of a step (``fsdp2.elastic_batch``)."""
from __future__ import annotations

import random

import pytest

from fsdp2.collectives import FSDPCommError
from fsdp2.elastic_batch import StepLedger, split_in_order


def test_split_is_in_order_and_the_larger_parts_come_first() -> None:
    parts = split_in_order(range(10, 17), [0, 1, 4])
    assert parts == {0: [10, 11, 12], 1: [13, 14], 4: [15, 16]}
    assert split_in_order([3], [0, 1]) == {0: [3], 1: []}


def test_lost_replicas_samples_go_to_the_survivors_and_nothing_else_is_recomputed() -> None:
    ledger = StepLedger(step=2, global_batch=8, shard_size=2)
    first = ledger.assign([0, 1, 2, 3])
    assert first == {0: [16, 17], 1: [18, 19], 2: [20, 21], 3: [22, 23]}
    assert ledger.replica_part(first, 1) == [20, 21, 22, 23]
    ledger.drop([1])  # replica 1 (ranks 2, 3) left
    assert ledger.pending == [20, 21, 22, 23]
    assert ledger.assign([0, 1]) == {0: [20, 21], 1: [22, 23]}
    assert sorted(ledger.done[0]) == list(range(16, 24)) and not ledger.pending


def test_every_sample_is_computed_once_by_a_live_replica_through_any_sequence_of_losses() -> None:
    rng = random.Random(7)
    for _ in range(200):
        shard, replicas, batch = rng.randint(1, 3), rng.randint(2, 5), rng.randint(1, 40)
        ledger = StepLedger(step=rng.randrange(5), global_batch=batch, shard_size=shard)
        live = list(range(replicas))
        computed: dict[int, list[int]] = {}
        while True:
            parts = ledger.assign([r * shard + j for r in live for j in range(shard)])
            for r in live:
                computed.setdefault(r, []).extend(ledger.replica_part(parts, r))
            if len(live) == 1 or rng.random() < 0.5:
                break
            gone = rng.sample(live, rng.randint(1, len(live) - 1))
            live = [r for r in live if r not in gone]
            for r in gone:
                computed.pop(r, None)
            ledger.drop(gone)
        samples = sorted(s for r in live for s in computed[r])
        lo = min(samples) if samples else 0
        assert samples == list(range(lo, lo + batch)), (shard, replicas, batch, samples)
        assert sorted(s for r in live for s in ledger.done[r]) == samples


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_a_global_batch_that_is_not_a_positive_int_is_refused_by_name(bad: object) -> None:
    with pytest.raises(FSDPCommError, match=r"global_batch must be a positive int, got "):
        StepLedger(step=0, global_batch=bad, shard_size=2)  # type: ignore[arg-type]
