"""Which samples of a step's global batch each live rank computes, across the passes of one step
of elastic HSDP: the first pass splits the whole batch over the live ranks; after replicas are
lost in the middle of the step, a make-up pass splits only the samples those replicas held over
the ranks that remain (the survivors keep the gradients of what they computed)."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from fsdp2.collectives import FSDPCommError


def split_in_order(samples: Sequence[int], ranks: Sequence[int]) -> dict[int, list[int]]:
    """``samples`` split in order over ``ranks``: consecutive parts whose sizes differ by one at
    most, the larger ones first."""
    per, extra = divmod(len(samples), len(ranks))
    parts: dict[int, list[int]] = {}
    start = 0
    for i, rank in enumerate(ranks):
        end = start + per + (1 if i < extra else 0)
        parts[rank] = list(samples[start:end])
        start = end
    return parts


class StepLedger:
    """The samples of step ``step`` (``[step * B, (step + 1) * B)``) not yet computed by a live
    replica, and those each replica has computed (its gradient shards hold their sum)."""

    def __init__(self, step: int, global_batch: int, shard_size: int) -> None:
        if not isinstance(global_batch, int) or isinstance(global_batch, bool) or global_batch < 1:
            raise FSDPCommError(f"global_batch must be a positive int, got {global_batch!r}")
        self.shard_size = shard_size
        self.pending: list[int] = list(range(step * global_batch, (step + 1) * global_batch))
        self.done: dict[int, list[int]] = {}

    def assign(self, members: Sequence[int]) -> dict[int, list[int]]:
        """The next pass: every pending sample goes to one of ``members`` (job ranks, in order)."""
        parts = split_in_order(self.pending, members)
        for rank, samples in parts.items():
            self.done.setdefault(rank // self.shard_size, []).extend(samples)
        self.pending = []
        return parts

    def replica_part(self, parts: dict[int, list[int]], replica: int) -> list[int]:
        """The samples the ranks of ``replica`` got in ``parts``."""
        return [s for rank, samples in parts.items() if rank // self.shard_size == replica for s in samples]

    def drop(self, replicas: Iterable[int]) -> None:
        """The gradients of ``replicas`` are gone (they left, or a pass of theirs did not
        complete): what they computed is pending again."""
        for r in replicas:
            self.pending.extend(self.done.pop(r, []))
        self.pending.sort()
