"""Views of a report that stay readable at cluster size: ranks grouped by what they did.

A finding on 1,024 ranks lists one line per distinct call (``ranks 0-2,4-1023: all_reduce(...)``
and ``rank 3: all_reduce(...)``) instead of one line per rank; the straggler table keeps its
slowest rows; the HTML timeline shows lanes of rank groups (culprit ranks keep lanes of their
own) whose bars span the group's first start to last finish of each op.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from torchcomms.errors import format_ranks

__all__ = ["group_ranks", "ranks_label", "describe_groups", "rank_groups", "merge_runs", "LANE_LIMIT", "BARS_PER_LANE"]

#: more ranks than this: the timeline shows lanes of rank groups
LANE_LIMIT = 64
#: lanes of rank groups (culprit ranks add a lane each)
GROUP_LANES = 32
#: bars one aggregated lane holds at most (runs of consecutive ops are merged past it)
BARS_PER_LANE = 1500

_V = TypeVar("_V")


def ranks_label(ranks: Iterable[int]) -> str:
    """``rank 3`` or ``ranks 0-2,4-9``."""
    ranks = sorted(ranks)
    return f"rank{'s' if len(ranks) != 1 else ''} {format_ranks(ranks)}"


def group_ranks(values: Mapping[int, _V]) -> list[tuple[list[int], _V]]:
    """Ranks with equal values together: ``[(ranks, value), ...]``, the largest group first."""
    by: dict[Any, list[int]] = defaultdict(list)
    first: dict[Any, _V] = {}
    for rank in sorted(values):
        key = repr(values[rank])
        by[key].append(rank)
        first.setdefault(key, values[rank])
    return sorted(((ranks, first[key]) for key, ranks in by.items()),
                  key=lambda item: (-len(item[0]), item[0][0]))


def describe_groups(values: Mapping[int, str]) -> str:
    """``ranks 0-2,4-9 [[64]], rank 3 [[32]]``: each distinct value once, after its ranks."""
    return ", ".join(f"{ranks_label(ranks)} {value}" for ranks, value in group_ranks(values))


def rank_groups(ranks: list[int], culprits: set[int], lanes: int = GROUP_LANES) -> list[list[int]]:
    """Lanes for ``ranks``: each culprit rank alone, the others in up to ``lanes`` blocks of
    consecutive ranks."""
    others = [r for r in ranks if r not in culprits]
    size = max(1, math.ceil(len(others) / lanes))
    groups = [others[i:i + size] for i in range(0, len(others), size)]
    groups += [[r] for r in sorted(culprits) if r in set(ranks)]
    return sorted(groups, key=lambda g: g[0])


def merge_runs(bars: list[dict[str, Any]], limit: int = BARS_PER_LANE) -> list[dict[str, Any]]:
    """At most ``limit`` bars per (lane, comm): past it, runs of consecutive bars (by start)
    become one bar that names how many ops it holds; culprit bars are never merged away."""
    by_comm: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for bar in bars:
        by_comm[bar["comm"]].append(bar)
    out: list[dict[str, Any]] = []
    for comm_bars in by_comm.values():
        comm_bars.sort(key=lambda b: b["start"])
        if len(comm_bars) <= limit:
            out.extend(comm_bars)
            continue
        run = math.ceil(len(comm_bars) / limit)
        for i in range(0, len(comm_bars), run):
            chunk = comm_bars[i:i + run]
            out.extend(b for b in chunk if b["culprit"])
            plain = [b for b in chunk if not b["culprit"]]
            if not plain:
                continue
            if len(plain) == 1:
                out.append(plain[0])
                continue
            ops: dict[str, int] = defaultdict(int)
            for b in plain:
                ops[b["op"]] += 1
            head = plain[0]
            out.append({**head, "op": max(ops, key=lambda o: ops[o]),
                        "end": max(b["end"] for b in plain), "state": "completed",
                        "inflight": any(b["inflight"] for b in plain), "error": None,
                        "call": f"{len(plain)} ops, #{head['seq']} to #{plain[-1]['seq']}: "
                                + ", ".join(f"{n} {o}" for o, n in sorted(ops.items())),
                        "merged": len(plain)})
    return out
