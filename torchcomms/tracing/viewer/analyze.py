"""Cross-rank analysis of flight-recorder dumps: who hung, who mismatched, who straggled.

Ops are aligned by ``(comm, collective seq)``; point-to-point ops by ``(comm, src, dst)`` in
order. The result is a :class:`Report` of findings (problems set the exit code) plus
statistics (stragglers, slowest ops, bandwidth).

The work is done on the job's table of ops (:mod:`.align`): a communicator's collectives are a
ranks x sequence-number grid whose statistics (arrival lags, durations, bandwidth) are computed
in arrays; only the columns that can hold a finding (a rank's first missing op, calls that
differ, a failure, every op still started) and the send/receive pairs whose counts or sizes
differ are checked op by op, by the code that words the findings.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from torchcomms.errors import format_ranks as fmt_ranks
from torchcomms.tracing.viewer.aggregate import describe_groups
from torchcomms.tracing.viewer.align import Grid, Table
from torchcomms.tracing.viewer.columns import Kind
from torchcomms.tracing.viewer.load import CommMeta, Op, TraceSet

# Which of (inputs, outputs) must be identical on every rank, per op.
_SAME_SHAPES: dict[str, tuple[bool, bool]] = {
    "all_reduce": (True, True),
    "broadcast": (True, True),
    "all_gather": (True, True),
    "all_gather_single": (True, True),
    "reduce_scatter": (True, True),
    "reduce_scatter_single": (True, True),
    "all_to_all_single": (True, True),
    "reduce": (True, False),
    "gather": (True, False),
    "gather_single": (True, False),
    "scatter": (False, True),
}
_ROOTED = frozenset({"broadcast", "reduce", "gather", "gather_single", "scatter"})
_REDUCING = frozenset({"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_v", "reduce_scatter_single"})
_DTYPE_BYTES = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2, "int8": 1, "uint8": 1,
    "bool": 1, "complex64": 8, "complex128": 16, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Byte": 1, "Char": 1, "Bool": 1,
}


def _bus_factor(op: str, n: int) -> float:
    if n <= 1:
        return 1.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op.startswith(("all_gather", "reduce_scatter", "all_to_all")):
        return (n - 1) / n
    return 1.0


def fmt_time(ns: int | None) -> str:
    if not ns:
        return "?"
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S")


def op_bytes(op: Op | Kind) -> int:
    sizes, dtypes = op.input_sizes, op.input_dtypes
    total = 0
    for i, s in enumerate(sizes):
        d = dtypes[i] if i < len(dtypes) else (dtypes[0] if dtypes else "float32")
        total += math.prod(s) * _DTYPE_BYTES.get(d.replace("torch.", ""), 4)
    return total


def describe_call(op: Op) -> str:
    """``all_reduce(in=[[1024]] float32, out=[[1024]], root=0) started at x.py:12``."""
    parts = [f"in={op.input_sizes}"]
    if op.input_dtypes:
        parts[-1] += " " + ",".join(sorted(set(op.input_dtypes)))
    parts.append(f"out={op.output_sizes}")
    if op.output_dtypes and set(op.output_dtypes) != set(op.input_dtypes):
        parts[-1] += " " + ",".join(sorted(set(op.output_dtypes)))
    if op.root is not None:
        parts.append(f"root={op.root}")
    if op.peer is not None:
        parts.append(f"peer={op.peer}")
    if op.reduce_op:
        parts.append(f"op={op.reduce_op}")
    s = f"{op.op}({', '.join(parts)}) {op.state}"
    if op.outcome:
        s += f", still in the engine after the caller got {op.outcome}"
    if op.call_site:
        s += f" at {op.call_site}"
    return s


@dataclass
class Finding:
    """One problem: a ``kind`` (missing_rank, mismatch, failed, stuck, p2p_unmatched,
    missing_dump), a one-line ``message`` and per-rank ``calls``."""

    kind: str
    comm: str
    message: str
    op: str | None = None
    seq: int | None = None
    ranks: list[int] = field(default_factory=list)
    calls: dict[int, str] = field(default_factory=dict)
    since_ns: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "comm": self.comm, "message": self.message, "op": self.op, "seq": self.seq,
            "ranks": self.ranks, "calls": {str(k): v for k, v in self.calls.items()}, "since_ns": self.since_ns,
        }


@dataclass
class Report:
    ranks: list[int]
    run_id: str | None
    comms: dict[str, CommMeta]
    findings: list[Finding] = field(default_factory=list)
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    slowest: list[dict[str, Any]] = field(default_factory=list)
    bandwidth: list[dict[str, Any]] = field(default_factory=list)
    op_count: int = 0
    collective_count: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def culprit_ranks(self) -> set[int]:
        out: set[int] = set()
        for f in self.findings:
            if f.kind in ("missing_rank", "missing_dump", "p2p_unmatched"):
                out.update(f.ranks)
        return out

    @property
    def culprit_ops(self) -> set[tuple[str, int]]:
        return {(f.comm, f.seq) for f in self.findings if f.seq is not None and f.kind in ("missing_rank", "mismatch", "stuck", "failed")}

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "run_id": self.run_id,
            "comms": {k: {"ranks": v.ranks, "desc": v.desc, "backend": v.backend} for k, v in self.comms.items()},
            "findings": [f.as_dict() for f in self.findings],
            "stragglers": self.stragglers,
            "slowest": self.slowest,
            "bandwidth": self.bandwidth,
            "op_count": self.op_count,
            "collective_count": self.collective_count,
            "notes": self.notes,
            "exit_code": self.exit_code,
        }


def analyze(ts: TraceSet, *, top: int = 10) -> Report:
    """Analyse a job's dumps."""
    comms = ts.comms()
    report = Report(ranks=ts.ranks, run_id=ts.run_id, comms=comms)
    table = ts.table()
    report.op_count = len(table.kind)
    scheduled = table.state_id("scheduled")
    for r, d in sorted(ts.dumps.items()):
        rows = slice(table.offsets[table.ranks.index(r)], table.offsets[table.ranks.index(r) + 1])
        if d.source == "pytorch" and len(table.state[rows]) and bool(np.all(table.state[rows] == scheduled)):
            report.notes.append(f"rank {r}: PyTorch dump whose entries never left 'scheduled' (gloo does not report progress); states ignored")
    lags: dict[int, list[float]] = defaultdict(list)
    last_counts: dict[int, int] = defaultdict(int)
    durations: list[dict[str, Any]] = []
    bw: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for name, meta in sorted(comms.items()):
        members = meta.ranks
        dumped = [r for r in members if r in ts.dumps]
        absent = [r for r in members if r not in ts.dumps]
        if absent:
            report.findings.append(Finding(
                kind="missing_dump", comm=name, ranks=absent,
                message=f"no dump from rank{'s' if len(absent) > 1 else ''} {fmt_ranks(absent)} of comm '{name}' (process died before dumping, or the file was not given)",
            ))
        ranks = list(dict.fromkeys(dumped))
        _collectives(report, name, table.grid(name, ranks), table, ts, lags, last_counts, durations, bw)
        _p2p(report, name, meta, ranks, table.p2p_rows(name, ranks), table)
    report.stragglers = _straggler_table(lags, last_counts)
    durations.sort(key=lambda x: -x["duration_ms"])
    report.slowest = durations[:top]
    report.bandwidth = [
        {
            "comm": c, "op": o, "bytes": b, "count": len(v), "mean_ms": statistics.fmean(v),
            "algbw_gbps": (b / (statistics.fmean(v) / 1e3) / 1e9) if statistics.fmean(v) > 0 else None,
            "busbw_gbps": (b / (statistics.fmean(v) / 1e3) / 1e9 * _bus_factor(o, len(comms[c].ranks))) if statistics.fmean(v) > 0 else None,
        }
        for (c, o, b), v in sorted(bw.items())
    ]
    return report


#: cells (ranks x sequence numbers) a communicator's grid is checked in at a time
GRID_CELLS = 1 << 22


def _collectives(
    report: Report, name: str, grid: Grid, table: Table, ts: TraceSet,
    lags: dict[int, list[float]], last_counts: dict[int, int], durations: list[dict[str, Any]],
    bw: dict[tuple[str, str, int], list[float]],
) -> None:
    """Check a communicator's collectives column by column (one column per sequence number),
    in blocks of columns: the columns that can hold a finding op by op, the statistics of all
    of them in arrays."""
    n_ranks, n_seqs = len(grid.ranks), len(grid.seqs)
    if not n_ranks:
        return
    report.collective_count += n_seqs
    lo = grid.first_column()
    seen = np.zeros(n_ranks, dtype=bool)  # ranks that already lacked a seq (their first is reported)
    reported_missing: set[int] = set()
    width = max(1, GRID_CELLS // n_ranks)
    for j0 in range(0, n_seqs, width):
        j1 = min(n_seqs, j0 + width)
        _block(report, name, grid, j0, grid.block(j0, j1), lo, seen, reported_missing, table, ts, lags,
               last_counts, durations, bw)


def _block(
    report: Report, name: str, grid: Grid, j0: int, rows: np.ndarray, lo: np.ndarray, seen: np.ndarray,
    reported_missing: set[int], table: Table, ts: TraceSet, lags: dict[int, list[float]],
    last_counts: dict[int, int], durations: list[dict[str, Any]], bw: dict[tuple[str, str, int], list[float]],
) -> None:
    ranks = grid.ranks
    n_ranks, n_seqs = rows.shape
    present = rows >= 0
    safe = np.where(present, rows, 0)
    cols = np.arange(n_seqs)
    # a rank "never entered" a seq it lacks unless the seq is older than its oldest (evicted)
    never = ~present & ((cols[None, :] + j0) >= lo[:, None])
    count = present.sum(axis=0)
    everyone = count == n_ranks
    state = np.where(present, table.state[safe], -1)
    # columns that may hold a finding: a rank's first "never", different calls, a failure, or
    # every present op still started (stuck)
    interesting = np.zeros(n_seqs, dtype=bool)
    lacking = never.any(axis=1)
    interesting[never.argmax(axis=1)[lacking & ~seen]] = True
    seen |= lacking
    sig = table.kind_sig[table.kind[safe]]
    big = np.iinfo(np.int64).max
    interesting |= np.where(present, sig, big).min(axis=0) != np.where(present, sig, -1).max(axis=0)
    for bad in ("failed", "timed_out"):
        sid = table.state_id(bad)
        if sid >= 0:
            interesting |= (state == sid).any(axis=0)
    started = table.state_id("started")
    if started >= 0:
        interesting |= ((state == started) | ~present).all(axis=0)
    for j in np.flatnonzero(interesting).tolist():
        at = np.flatnonzero(present[:, j])
        present_ops = dict(zip([ranks[i] for i in at.tolist()], table.ops(rows[at, j])))
        never_ranks = [ranks[i] for i in np.flatnonzero(never[:, j]).tolist()]
        _column_findings(report, name, int(grid.seqs[j0 + j]), present_ops, never_ranks, n_ranks, ts, reported_missing)
    # arrival lags: columns every rank entered, all with a creation time
    created = table.created[safe]
    timed = everyone & (table.has_created[safe] & (created != 0)).all(axis=0)
    if n_ranks > 1 and timed.any():
        c = created[:, timed]
        first = c.min(axis=0)
        for i in c.argmax(axis=0).tolist():
            last_counts[ranks[i]] += 1
        lag = (c - first[None, :]) / 1e6
        for i, r in enumerate(ranks):
            lags[r].extend(lag[i].tolist())
    # durations: columns whose every present op completed with a duration
    completed = table.state_id("completed")
    done = (count > 0) & ((state == completed) | ~present).all(axis=0) & (table.has_duration[safe] | ~present).all(axis=0)
    if not done.any():
        return
    dur = np.where(present, table.duration[safe], -np.inf)
    longest = dur.max(axis=0)
    odd = np.isnan(dur).any(axis=0) | (dur == 0).any(axis=0)  # NaN / signed zeros: as max() picks
    first_row = rows[present.argmax(axis=0), cols]  # each column's sample: its first rank's op
    sample_kind = table.kind[first_row]
    shown = np.where(table.has_core_seq[first_row], table.core_seq[first_row], table.seq[first_row])
    nbytes_of: dict[int, int] = {}
    for j in np.flatnonzero(done).tolist():
        if odd[j]:
            d = max(table.duration[rows[i, j]].item() for i in np.flatnonzero(present[:, j]).tolist())
        else:
            d = longest[j].item()
        k = int(sample_kind[j])
        kind = table.kinds[k]
        nbytes = nbytes_of.get(k)
        if nbytes is None:
            nbytes = nbytes_of[k] = op_bytes(kind)
        durations.append({"comm": name, "op": kind.op, "seq": int(shown[j]), "duration_ms": d, "bytes": nbytes, "ranks": int(count[j])})
        if d > 0 and kind.op != "barrier":
            bw[(name, kind.op, nbytes)].append(d)


def _column_findings(report: Report, name: str, seq: int, present: dict[int, Op], never: list[int], n_ranks: int,
                     ts: TraceSet, reported_missing: set[int]) -> None:
    """The findings of one collective (``seq`` on ``name``) from the ops of the ranks in it."""
    sample = next(iter(present.values()))
    fresh = [r for r in never if r not in reported_missing]
    if fresh:
        reported_missing.update(fresh)
        waiting = sorted(present)
        since = min((o.created_ns for o in present.values() if o.created_ns), default=None)
        msg = (
            f"rank{'s' if len(fresh) > 1 else ''} {fmt_ranks(fresh)} never entered {sample.op} #{sample.display_seq} "
            f"on comm '{name}'; rank{'s' if len(waiting) > 1 else ''} {fmt_ranks(waiting)} waiting since {fmt_time(since)} UTC"
        )
        if sample.call_site:
            msg += f" (called at {sample.call_site})"
        report.findings.append(Finding(
            kind="missing_rank", comm=name, op=sample.op, seq=sample.display_seq, ranks=sorted(fresh),
            calls={r: describe_call(o) for r, o in present.items()}, since_ns=since, message=msg,
        ))
    _check_match(report, name, seq, present)
    failed = {r: o for r, o in present.items() if o.state in ("failed", "timed_out")}
    if failed:
        kinds = sorted({o.state for o in failed.values()})
        err = next((o.error for o in failed.values() if o.error), None)
        report.findings.append(Finding(
            kind="failed", comm=name, op=sample.op, seq=sample.display_seq, ranks=sorted(failed),
            calls={r: describe_call(o) for r, o in present.items()},
            message=f"{sample.op} #{sample.display_seq} on comm '{name}' {'/'.join(kinds)} on rank{'s' if len(failed) > 1 else ''} {fmt_ranks(failed)}" + (f": {err}" if err else ""),
        ))
    elif not never and len(present) == n_ranks and _all_ours(ts, present) and all(o.state == "started" for o in present.values()):
        report.findings.append(Finding(
            kind="stuck", comm=name, op=sample.op, seq=sample.display_seq, ranks=sorted(present),
            calls={r: describe_call(o) for r, o in present.items()},
            message=f"every rank entered {sample.op} #{sample.display_seq} on comm '{name}' but it never completed",
        ))


def _all_ours(ts: TraceSet, present: dict[int, Op]) -> bool:
    return all(ts.dumps[r].source == "torchcomms" for r in present)


def _check_match(report: Report, name: str, seq: int, present: dict[int, Op]) -> None:
    if len(present) < 2:
        return
    ops = list(present.values())
    problems: list[str] = []
    if len({o.op for o in ops}) > 1:
        problems.append("different ops: " + describe_groups({r: o.op for r, o in present.items()}))
    else:
        op = ops[0].op
        same_in, same_out = _SAME_SHAPES.get(op, (False, False))
        if same_in and len({repr(o.input_sizes) for o in ops}) > 1:
            problems.append("input sizes differ: " + describe_groups({r: str(o.input_sizes) for r, o in present.items()}))
        if same_out and len({repr(o.output_sizes) for o in ops if o.output_sizes}) > 1:
            problems.append("output sizes differ: " + describe_groups({r: str(o.output_sizes) for r, o in present.items()}))
        dts = {r: tuple(sorted(set(o.input_dtypes))) for r, o in present.items() if o.input_dtypes}
        if len(set(dts.values())) > 1:
            problems.append("dtypes differ: " + describe_groups({r: ",".join(d) for r, d in dts.items()}))
        if op in _ROOTED:
            roots = {r: o.root for r, o in present.items() if o.root is not None}
            if len(set(roots.values())) > 1:
                problems.append("roots differ: " + describe_groups({r: f"root={v}" for r, v in roots.items()}))
        if op in _REDUCING:
            red = {r: o.reduce_op for r, o in present.items() if o.reduce_op}
            if len(set(red.values())) > 1:
                problems.append("reduce ops differ: " + describe_groups({r: str(v) for r, v in red.items()}))
    if problems:
        sample = ops[0]
        report.findings.append(Finding(
            kind="mismatch", comm=name, op=sample.op, seq=sample.display_seq, ranks=sorted(present),
            calls={r: describe_call(o) for r, o in sorted(present.items())},
            message=f"mismatched collective #{sample.display_seq} on comm '{name}': " + "; ".join(problems),
        ))


def _p2p(report: Report, name: str, meta: CommMeta, posted: list[int], rows: np.ndarray, table: Table) -> None:
    """Pair each (src, dst)'s sends and receives in order; the pairs that can hold a finding
    (unequal counts, sizes that differ) are checked op by op."""
    if not len(rows):
        return
    ranks = meta.ranks
    kinds = table.kind[rows]
    uniq = np.unique(kinds)
    role = np.zeros(len(table.kinds) if len(uniq) else 0, dtype=np.int8)
    peer = np.zeros(len(role), dtype=np.int64)
    for k in uniq.tolist():
        kind = table.kinds[k]
        p = kind.peer
        if p is None or kind.op not in ("send", "recv"):
            continue
        role[k] = 1 if kind.op == "send" else 2
        peer[k] = ranks[p] if 0 <= p < len(ranks) else p
    me = table.rank_of_row[rows]
    is_send, is_recv = role[kinds] == 1, role[kinds] == 2
    src = np.where(is_send, me, peer[kinds])
    dst = np.where(is_send, peer[kinds], me)
    used = is_send | is_recv
    if used.any() and min(src[used].min(), dst[used].min()) < 0:  # no order-keeping key: pair them all
        keys_of = sorted({(int(a), int(b)) for a, b in zip(src[used].tolist(), dst[used].tolist())})
        _p2p_keys(report, name, set(posted), keys_of, rows, is_send, is_recv, src, dst, table)
        return
    width = int(max(src[used].max(), dst[used].max())) + 1 if used.any() else 1
    key = src * width + dst
    s_key, r_key = key[is_send], key[is_recv]
    s_order, r_order = np.argsort(s_key, kind="stable"), np.argsort(r_key, kind="stable")
    all_keys = np.union1d(s_key, r_key)
    n_s = np.zeros(len(all_keys), dtype=np.int64)
    n_r = np.zeros(len(all_keys), dtype=np.int64)
    u, c = np.unique(s_key, return_counts=True)
    n_s[np.searchsorted(all_keys, u)] = c
    u, c = np.unique(r_key, return_counts=True)
    n_r[np.searchsorted(all_keys, u)] = c
    odd = n_s != n_r
    # equal counts: the i-th send meets the i-th receive; sizes must agree
    even_s = ~odd[np.searchsorted(all_keys, s_key[s_order])]
    even_r = ~odd[np.searchsorted(all_keys, r_key[r_order])]
    s_rows, r_rows = rows[is_send][s_order][even_s], rows[is_recv][r_order][even_r]
    sk, rk = table.kind[s_rows], table.kind[r_rows]
    differ = (table.kind_in_sizes[sk] != table.kind_out_sizes[rk]) & table.kind_has_out[rk]
    odd[np.searchsorted(all_keys, s_key[s_order][even_s][differ])] = True
    keys_of = [(k // width, k % width) for k in all_keys[odd].tolist()]
    _p2p_keys(report, name, set(posted), keys_of, rows, is_send, is_recv, src, dst, table)


def _p2p_keys(report: Report, name: str, posted: set[int], keys: list[tuple[int, int]], rows: np.ndarray,
              is_send: np.ndarray, is_recv: np.ndarray, src: np.ndarray, dst: np.ndarray, table: Table) -> None:
    """The findings of the (src, dst) pairs ``keys``, in order, op by op."""
    for key in keys:
        src_r, dst_r = key
        at = (src == src_r) & (dst == dst_r)
        s_list, r_list = table.ops(rows[at & is_send]), table.ops(rows[at & is_recv])
        _p2p_pair(report, name, posted, src_r, dst_r, s_list, r_list)


def _p2p_pair(report: Report, name: str, posted: set[int], src: int, dst: int, s_list: list[Op], r_list: list[Op]) -> None:
    for i in range(max(len(s_list), len(r_list))):
        s = s_list[i] if i < len(s_list) else None
        rv = r_list[i] if i < len(r_list) else None
        if s is not None and rv is not None:
            if s.input_sizes != rv.output_sizes and rv.output_sizes:
                report.findings.append(Finding(
                    kind="mismatch", comm=name, op="send/recv", seq=None, ranks=[src, dst],
                    calls={src: describe_call(s), dst: describe_call(rv)},
                    message=f"send #{i + 1} from rank {src} to rank {dst} on comm '{name}' has size {s.input_sizes}, the matching recv expects {rv.output_sizes}",
                ))
            continue
        have = s or rv
        assert have is not None
        if dst not in posted and src not in posted:
            continue
        if s is None and src not in posted:
            continue
        if rv is None and dst not in posted:
            continue
        lacking, role = (dst, "recv from") if rv is None else (src, "send to")
        other = src if rv is None else dst
        report.findings.append(Finding(
            kind="p2p_unmatched", comm=name, op=have.op, seq=None, ranks=[lacking],
            calls={have.rank: describe_call(have)}, since_ns=have.created_ns,
            message=f"rank {lacking} never posted the {role} rank {other} matching {have.op} #{i + 1} of rank {have.rank} on comm '{name}' (waiting since {fmt_time(have.created_ns)} UTC)",
        ))
        break


def _straggler_table(lags: dict[int, list[float]], last_counts: dict[int, int]) -> list[dict[str, Any]]:
    rows = []
    for r, v in lags.items():
        if not v:
            continue
        rows.append({
            "rank": r, "collectives": len(v), "mean_lag_ms": statistics.fmean(v), "p50_lag_ms": statistics.median(v),
            "max_lag_ms": max(v), "times_last": last_counts.get(r, 0),
        })
    rows.sort(key=lambda x: -x["mean_lag_ms"])
    return rows
