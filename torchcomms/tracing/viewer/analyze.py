"""Cross-rank analysis of flight-recorder dumps: who hung, who mismatched, who straggled.

Ops are aligned by ``(comm, collective seq)``; point-to-point ops by ``(comm, src, dst)`` in
order. The result is a :class:`Report` of findings (problems set the exit code) plus
statistics (stragglers, slowest ops, bandwidth).
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from torchcomms.errors import format_ranks as fmt_ranks
from torchcomms.tracing.viewer.aggregate import describe_groups
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


def op_bytes(op: Op) -> int:
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
    report.op_count = sum(len(d.ops) for d in ts.dumps.values())
    for r, d in sorted(ts.dumps.items()):
        if d.source == "pytorch" and all(o.state == "scheduled" for o in d.ops) and d.ops:
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
        per_rank: dict[int, dict[int, Op]] = {}
        p2p: dict[int, list[Op]] = {}
        for r in dumped:
            ops = [o for o in ts.dumps[r].ops if o.comm == name]
            per_rank[r] = {o.seq: o for o in ops if not o.is_p2p}
            p2p[r] = [o for o in ops if o.is_p2p]
        _collectives(report, name, members, per_rank, ts, lags, last_counts, durations, bw)
        _p2p(report, name, meta, p2p)
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


def _collectives(
    report: Report, name: str, members: list[int], per_rank: dict[int, dict[int, Op]], ts: TraceSet,
    lags: dict[int, list[float]], last_counts: dict[int, int], durations: list[dict[str, Any]],
    bw: dict[tuple[str, str, int], list[float]],
) -> None:
    if not per_rank:
        return
    bounds = {r: (min(ops), max(ops)) if ops else (None, None) for r, ops in per_rank.items()}
    all_seqs = sorted({s for ops in per_rank.values() for s in ops})
    reported_missing: set[int] = set()
    for seq in all_seqs:
        present = {r: ops[seq] for r, ops in per_rank.items() if seq in ops}
        never: list[int] = []
        for r, ops in per_rank.items():
            if seq in ops:
                continue
            lo, hi = bounds[r]
            if hi is None or seq > hi:
                never.append(r)
            elif lo is not None and seq < lo:
                continue  # evicted from that rank's ring: unknown
            else:
                never.append(r)
        report.collective_count += 1
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
        elif not never and len(present) == len(per_rank) and _all_ours(ts, present) and all(o.state == "started" for o in present.values()):
            report.findings.append(Finding(
                kind="stuck", comm=name, op=sample.op, seq=sample.display_seq, ranks=sorted(present),
                calls={r: describe_call(o) for r, o in present.items()},
                message=f"every rank entered {sample.op} #{sample.display_seq} on comm '{name}' but it never completed",
            ))
        if len(present) == len(per_rank) and len(present) > 1 and not never:
            created = {r: o.created_ns for r, o in present.items() if o.created_ns}
            if len(created) == len(present):
                first = min(created.values())
                last_rank = max(created, key=lambda r: created[r])
                last_counts[last_rank] += 1
                for r, c in created.items():
                    lags[r].append((c - first) / 1e6)
        done = [o for o in present.values() if o.state == "completed" and o.duration_ms is not None]
        if done and len(done) == len(present):
            dur = max(o.duration_ms for o in done if o.duration_ms is not None)
            durations.append({"comm": name, "op": sample.op, "seq": sample.display_seq, "duration_ms": dur, "bytes": op_bytes(sample), "ranks": len(present)})
            if dur > 0 and sample.op != "barrier":
                bw[(name, sample.op, op_bytes(sample))].append(dur)


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


def _p2p(report: Report, name: str, meta: CommMeta, p2p: dict[int, list[Op]]) -> None:
    if not any(p2p.values()):
        return
    ranks = meta.ranks

    def to_global(comm_rank: int | None) -> int | None:
        if comm_rank is None:
            return None
        return ranks[comm_rank] if 0 <= comm_rank < len(ranks) else comm_rank

    sends: dict[tuple[int, int], list[Op]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[Op]] = defaultdict(list)
    for r, ops in p2p.items():
        for o in ops:
            peer = to_global(o.peer)
            if peer is None:
                continue
            if o.op == "send":
                sends[(r, peer)].append(o)
            elif o.op == "recv":
                recvs[(peer, r)].append(o)
    for key in sorted(set(sends) | set(recvs)):
        src, dst = key
        s_list, r_list = sends.get(key, []), recvs.get(key, [])
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
            if dst not in p2p and src not in p2p:
                continue
            if s is None and src not in p2p:
                continue
            if rv is None and dst not in p2p:
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
