"""A job's ops in one table of arrays, and their alignment across ranks.

:class:`Table` joins every rank's :class:`~.columns.OpColumns` (rows in rank-then-entry order,
kinds numbered job-wide with per-kind features: communicator, op, match signature, sizes).
:meth:`Table.grid` lays a communicator's collectives out as ranks x sequence numbers, the shape
the analysis checks column by column; :meth:`Table.p2p_rows` lists its point-to-point rows.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchcomms.tracing.viewer.columns import OpColumns, columns_of_ops

__all__ = ["Grid", "Table"]


def _concat(arrays: list[np.ndarray], dtype: Any) -> np.ndarray:
    if not arrays:
        return np.zeros(0, dtype=dtype)
    return np.concatenate(arrays)


def _sizes_key(sizes: list[list[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(s) for s in sizes)


@dataclass
class Grid:
    """A communicator's collectives as ranks x sequence numbers: :meth:`block` gives, for
    columns ``j0:j1``, the table row of rank ``ranks[i]``'s op with sequence number ``seqs[j]``
    (its last one, as a dict keyed by seq keeps), -1 where it has none."""

    ranks: list[int]
    seqs: np.ndarray
    pos: np.ndarray  # per op of the communicator: its rank's place in ``ranks``
    col: np.ndarray  # ... its column
    rows: np.ndarray  # ... its table row (ascending within a rank)

    def first_column(self) -> np.ndarray:
        """Each rank's oldest column (0 for a rank with none)."""
        lo = np.full(len(self.ranks), len(self.seqs), dtype=np.int64)
        np.minimum.at(lo, self.pos, self.col)
        return np.where(lo == len(self.seqs), 0, lo)

    def block(self, j0: int, j1: int) -> np.ndarray:
        out = np.full((len(self.ranks), j1 - j0), -1, dtype=np.int64)
        if j0 == 0 and j1 == len(self.seqs):
            pos, col, rows = self.pos, self.col, self.rows
        else:
            sel = (self.col >= j0) & (self.col < j1)
            pos, col, rows = self.pos[sel], self.col[sel] - j0, self.rows[sel]
        np.maximum.at(out, (pos, col), rows)  # the largest row of a (rank, seq) is its last op
        return out


class Table:
    """Every op of a job (see the module doc)."""

    def __init__(self, dumps: dict[int, Sequence[Any]]) -> None:
        self.ranks = list(dumps)
        self.cols: list[OpColumns] = [columns_of_ops(r, ops) for r, ops in dumps.items()]
        lengths = np.array([len(c) for c in self.cols], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.rank_of_row = np.repeat(np.array(self.ranks, dtype=np.int64), lengths)
        self.kinds = [k for c in self.cols for k in c.kinds]
        kind_base = np.cumsum([0] + [len(c.kinds) for c in self.cols])
        self.kind = _concat([c.kind.astype(np.int64) + kind_base[i] for i, c in enumerate(self.cols)], np.int64)
        self.states: list[str] = []
        state_of: dict[str, int] = {}
        parts = []
        for c in self.cols:
            remap = np.array([state_of.setdefault(s, len(state_of)) for s in c.states] or [0], dtype=np.int16)
            parts.append(remap[c.state])
        self.states = list(state_of)
        self.state = _concat(parts, np.int16)
        self.seq = _concat([c.seq for c in self.cols], np.int64)
        self.created = _concat([c.created for c in self.cols], np.int64)
        self.has_created = _concat([c.has_created for c in self.cols], bool)
        self.completed = _concat([c.completed for c in self.cols], np.int64)
        self.has_completed = _concat([c.has_completed for c in self.cols], bool)
        self.duration = _concat([c.duration for c in self.cols], np.float64)
        self.has_duration = _concat([c.has_duration for c in self.cols], bool)
        self.core_seq = _concat([c.core_seq for c in self.cols], np.int64)
        self.has_core_seq = _concat([c.has_core_seq for c in self.cols], bool)
        # the ranks' columns become views of the joined ones: one copy of the numbers in memory
        for i, c in enumerate(self.cols):
            a, b = int(self.offsets[i]), int(self.offsets[i + 1])
            for name in ("seq", "created", "has_created", "completed", "has_completed", "duration", "has_duration",
                         "core_seq", "has_core_seq"):
                setattr(c, name, getattr(self, name)[a:b])
        # per kind
        comm_of: dict[str, int] = {}
        self.kind_comm = np.array([comm_of.setdefault(k.comm, len(comm_of)) for k in self.kinds], dtype=np.int64)
        self.comm_ids = comm_of
        self.kind_p2p = np.array([k.is_p2p for k in self.kinds], dtype=bool)
        sig_of: dict[Any, int] = {}
        self.kind_sig = np.array([sig_of.setdefault(
            (k.op, _sizes_key(k.input_sizes), _sizes_key(k.output_sizes), tuple(sorted(set(k.input_dtypes))),
             k.root, k.reduce_op), len(sig_of)) for k in self.kinds], dtype=np.int64)
        sizes_of: dict[Any, int] = {}
        self.kind_in_sizes = np.array([sizes_of.setdefault(_sizes_key(k.input_sizes), len(sizes_of))
                                       for k in self.kinds], dtype=np.int64)
        self.kind_out_sizes = np.array([sizes_of.setdefault(_sizes_key(k.output_sizes), len(sizes_of))
                                        for k in self.kinds], dtype=np.int64)
        self.kind_has_out = np.array([bool(k.output_sizes) for k in self.kinds], dtype=bool)
        self._groups: dict[int, np.ndarray] | None = None

    def state_id(self, state: str) -> int:
        """The table's number of ``state`` (-1 where no op has it)."""
        return self.states.index(state) if state in self.states else -1

    def ops(self, rows: np.ndarray | Sequence[int]) -> list[Any]:
        """The ``Op`` objects of these table rows."""
        rows = np.asarray(rows, dtype=np.int64)
        which = np.searchsorted(self.offsets, rows, side="right") - 1
        return [self.cols[w].ops_at([int(g - self.offsets[w])])[0] for g, w in zip(rows.tolist(), which.tolist())]

    def _comm_rows(self, comm: str, p2p: bool, ranks: list[int]) -> np.ndarray:
        """Rows of ``comm`` (its collectives or its point-to-point ops) on ``ranks``, ascending."""
        cid = self.comm_ids.get(comm)
        if cid is None:
            return np.zeros(0, dtype=np.int64)
        if self._groups is None:
            group = self.kind_comm[self.kind] * 2 + self.kind_p2p[self.kind]
            order = np.argsort(group, kind="stable")
            keys, starts = np.unique(group[order], return_index=True)
            ends = np.append(starts[1:], len(order))
            self._groups = {int(k): order[a:b] for k, a, b in zip(keys.tolist(), starts.tolist(), ends.tolist())}
        rows = self._groups.get(cid * 2 + int(p2p), np.zeros(0, dtype=np.int64))
        return rows[self._rank_pos(ranks)[self.rank_of_row[rows]] >= 0]

    def _rank_pos(self, ranks: list[int]) -> np.ndarray:
        """``lut[rank]``: the rank's place in ``ranks``, -1 for ranks not in it."""
        top = max([*self.ranks, *ranks, 0]) + 1
        lut = np.full(top, -1, dtype=np.int64)
        lut[np.array(ranks, dtype=np.int64)] = np.arange(len(ranks), dtype=np.int64)
        return lut

    def grid(self, comm: str, ranks: list[int]) -> Grid:
        """The collectives of ``comm`` on ``ranks`` (each a dumped rank, listed once)."""
        rows = self._comm_rows(comm, False, ranks)
        pos = self._rank_pos(ranks)[self.rank_of_row[rows]]
        seq = self.seq[rows]
        seqs = np.unique(seq) if len(rows) else np.zeros(0, dtype=self.seq.dtype)
        return Grid(ranks, seqs, pos, np.searchsorted(seqs, seq), rows)

    def p2p_rows(self, comm: str, ranks: list[int]) -> np.ndarray:
        """Table rows of ``comm``'s point-to-point ops on ``ranks``, rank by rank in entry order."""
        return self._comm_rows(comm, True, ranks)
