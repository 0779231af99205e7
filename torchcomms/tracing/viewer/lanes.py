"""The HTML timeline's bars for lanes of rank groups, computed on the job's table of ops.

One bar per (lane, comm, op, sequence number, point-to-point or not): from the group's first
start to its last finish, in flight if any of its ops is; the op that finished last names the
bar's state, error and call. Spans are grouped in arrays; only the bars that stay after
:func:`~.aggregate.merge_runs` build their call text.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from torchcomms.tracing.viewer.aggregate import merge_runs
from torchcomms.tracing.viewer.align import Table

__all__ = ["span_bounds", "group_bars"]

_FINISHED = ("completed", "failed", "timed_out", "aborted")


def _timed_rows(table: Table) -> np.ndarray:
    """Rows with a creation time, in rank order then entry order (``TraceSet.all_ops``'s)."""
    timed = table.has_created & (table.created != 0)
    by_rank = np.argsort(table.rank_of_row, kind="stable")
    return by_rank[timed[by_rank]]


def span_bounds(table: Table, dumped_at: list[int]) -> tuple[int, int]:
    """(origin, horizon) in ns: the first creation, and the last completion, creation or dump time."""
    rows = _timed_rows(table)
    if not len(rows):
        return 0, 0
    created = table.created[rows]
    completed = table.completed[rows]
    last = np.where(table.has_completed[rows] & (completed != 0), completed, created)
    return int(created.min()), max([int(last.max())] + dumped_at)


def group_bars(table: Table, lane_of: dict[int, int], lanes: int, culprit_ops: set[tuple[str, int]],
               origin: int, horizon: int, describe: Any) -> list[dict[str, Any]] | None:
    """The bars of every lane (see the module doc), or None where an op's numbers need the
    op-by-op path (a duration that is not finite, an integer past int64). ``describe(op)`` is
    the call text."""
    if any(a.dtype == object for a in (table.seq, table.created, table.completed, table.core_seq)):
        return None  # numbers past int64: the op-by-op path keeps them exact
    rows = _timed_rows(table)
    if not len(rows):
        return []
    kind = table.kind[rows]
    has_dur = table.has_duration[rows]
    dur = table.duration[rows]
    if not np.isfinite(dur[has_dur]).all():
        return None
    created = table.created[rows]
    completed = table.completed[rows]
    has_completed = table.has_completed[rows] & (completed != 0)
    end_ns = np.where(has_completed, completed,
                      np.where(has_dur, created + (dur * 1e6).astype(np.int64), horizon))
    start = (created - origin) / 1e6
    end = (np.maximum(end_ns, created) - origin) / 1e6
    state = table.state[rows]
    finished = np.isin(state, [table.state_id(s) for s in _FINISHED])
    inflight = ~finished | ((state != table.state_id("completed")) & ~has_completed)
    # group key: (lane, (comm, op, p2p), shown seq)
    lut = np.full(max(lane_of) + 1, -1, dtype=np.int64)
    lut[np.array(list(lane_of), dtype=np.int64)] = np.array(list(lane_of.values()), dtype=np.int64)
    lane = lut[table.rank_of_row[rows]]
    cls_of: dict[tuple[str, str, bool], int] = {}
    kind_cls = np.array([cls_of.setdefault((k.comm, k.op, k.is_p2p), len(cls_of)) for k in table.kinds], dtype=np.int64)
    classes = list(cls_of)
    shown = np.where(table.has_core_seq[rows], table.core_seq[rows], table.seq[rows])
    seqs, seq_id = np.unique(shown, return_inverse=True)
    key = (lane * len(classes) + kind_cls[kind]) * len(seqs) + seq_id.reshape(-1)
    order = np.argsort(key, kind="stable")
    k_sorted = key[order]
    heads = np.flatnonzero(np.r_[True, k_sorted[1:] != k_sorted[:-1]])
    counts = np.diff(np.r_[heads, len(order)])
    g_start = np.minimum.reduceat(start[order], heads)
    g_end = np.maximum.reduceat(end[order], heads)
    g_inflight = np.logical_or.reduceat(inflight[order], heads)
    pos = np.arange(len(order))
    at_max = np.where(end[order] == np.repeat(g_end, counts), pos, len(order))
    g_last = rows[order[np.minimum.reduceat(at_max, heads)]]  # the first op to reach the last end
    g_first = order[heads]  # where the group first appears: the dict's insertion order
    per_lane: list[list[dict[str, Any]]] = [[] for _ in range(lanes)]
    last_of: dict[int, int] = {}
    g_lane, g_cls, g_seq = lane[g_first], kind_cls[kind[g_first]], shown[g_first]
    g_state = table.state[g_last]
    for g in np.argsort(g_first, kind="stable").tolist():
        comm, op, is_p2p = classes[g_cls[g]]
        seq = int(g_seq[g])
        k = table.kinds[int(table.kind[g_last[g]])]
        bar = {
            "lane": int(g_lane[g]), "comm": comm, "op": op, "seq": seq, "state": table.states[g_state[g]],
            "start": float(g_start[g]), "end": float(g_end[g]), "call": None, "error": k.error,
            "inflight": bool(g_inflight[g]), "culprit": (not is_p2p) and (comm, seq) in culprit_ops,
        }
        last_of[id(bar)] = g
        per_lane[bar["lane"]].append(bar)
    out = [bar for bars in per_lane for bar in merge_runs(bars)]
    for bar in out:
        if bar["call"] is None:
            g = last_of[id(bar)]
            last = table.ops([g_last[g]])[0]
            bar["call"] = f"{counts[g]} ranks; last to finish: rank {last.rank}, {describe(last)}"
    return out
