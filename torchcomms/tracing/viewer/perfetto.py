"""Chrome / Perfetto trace-event JSON from flight-recorder dumps.

* one process per rank (``pid = rank``, ``process_name`` "rank N"), one thread track per
  communicator (``thread_name``);
* each op is an async slice (``b``/``e``, ``id2.local``) from creation to completion, with a
  nested ``running`` slice from start to completion when the dump knows the start;
* a 1 µs ``X`` marker at each rank's arrival, which the flow events (``s``/``t``/``f``,
  ``bp: "e"``) bind to: one flow per collective joins the ranks in arrival order;
* timestamps in µs relative to the earliest op (``otherData.origin_ns`` keeps the epoch).
"""
from __future__ import annotations

import hashlib
from typing import Any

from torchcomms.tracing.viewer.analyze import Report, describe_call
from torchcomms.tracing.viewer.load import Op, TraceSet


def _flow_id(comm: str, seq: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{comm}\x00{seq}".encode(), digest_size=6).digest(), "big")


def _end_ns(op: Op, horizon_ns: int) -> int:
    if op.completed_ns:
        return op.completed_ns
    if op.duration_ms is not None and op.created_ns:
        return op.created_ns + int(op.duration_ms * 1e6)
    return horizon_ns  # still in flight when dumped: runs to the end of the trace


def to_perfetto(ts: TraceSet, report: Report | None = None) -> dict[str, Any]:
    """The trace as a ``{"traceEvents": [...], ...}`` dict."""
    ops = [o for o in ts.all_ops() if o.created_ns]
    origin = min((o.created_ns for o in ops if o.created_ns), default=0)
    horizon = max(
        [o.completed_ns or o.created_ns or 0 for o in ops]
        + [d.dumped_at_ns or 0 for d in ts.dumps.values()]
    ) if ops else 0

    def us(ns: int) -> float:
        return (ns - origin) / 1e3

    comms = sorted(ts.comms())
    tids = {c: i + 1 for i, c in enumerate(comms)}
    culprits = report.culprit_ops if report else set()
    events: list[dict[str, Any]] = []
    for r in ts.ranks:
        d = ts.dumps[r]
        label = f"rank {r}" + (f" ({d.host})" if d.host else "")
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        for c in comms:
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tids[c], "args": {"name": f"comm {c}"}})
    flows: dict[tuple[str, int], list[Op]] = {}
    for o in sorted(ops, key=lambda o: (o.rank, o.record_id)):
        tid = tids[o.comm]
        end = max(_end_ns(o, horizon), o.created_ns or 0)
        slice_id = f"r{o.rank}-{o.record_id}"
        args = {
            "comm": o.comm, "seq": o.display_seq, "state": o.state, "call": describe_call(o),
            "input_sizes": o.input_sizes, "input_dtypes": o.input_dtypes, "output_sizes": o.output_sizes,
        }
        if o.error:
            args["error"] = o.error
        if (o.comm, o.display_seq) in culprits and not o.is_p2p:
            args["culprit"] = True
        name = f"{o.op} #{o.display_seq}"
        cat = f"torchcomms,{o.comm}"
        assert o.created_ns is not None
        events.append({"ph": "b", "cat": cat, "name": name, "id2": {"local": slice_id}, "pid": o.rank, "tid": tid, "ts": us(o.created_ns), "args": args})
        if o.started_ns and o.started_ns <= end:
            events.append({"ph": "b", "cat": cat, "name": "running", "id2": {"local": slice_id}, "pid": o.rank, "tid": tid, "ts": us(max(o.started_ns, o.created_ns))})
            events.append({"ph": "e", "cat": cat, "name": "running", "id2": {"local": slice_id}, "pid": o.rank, "tid": tid, "ts": us(end)})
        events.append({"ph": "e", "cat": cat, "name": name, "id2": {"local": slice_id}, "pid": o.rank, "tid": tid, "ts": us(end)})
        events.append({"ph": "X", "cat": cat, "name": f"enter {name}", "pid": o.rank, "tid": tid, "ts": us(o.created_ns), "dur": 1.0})
        if not o.is_p2p:
            flows.setdefault((o.comm, o.seq), []).append(o)
    for (comm, seq), members in flows.items():
        if len(members) < 2:
            continue
        members.sort(key=lambda o: (o.created_ns or 0, o.rank))
        fid = _flow_id(comm, seq)
        for i, o in enumerate(members):
            ph = "s" if i == 0 else ("f" if i == len(members) - 1 else "t")
            assert o.created_ns is not None
            ev = {"ph": ph, "cat": "collective", "name": f"{o.op} #{o.display_seq}", "id": fid, "pid": o.rank, "tid": tids[o.comm], "ts": us(o.created_ns) + 0.5}
            if ph != "s":
                ev["bp"] = "e"
            events.append(ev)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"origin_ns": origin, "run_id": ts.run_id or "", "generator": "torchcomms-trace"},
    }
