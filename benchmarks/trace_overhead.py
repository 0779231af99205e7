"""What tracing costs per op: flight recorder, structured logs and spans, each on vs off.

Part 1, the hooks alone on real ``OpRecord``s, called the way the dispatch path calls them
(thread CPU µs per op; anchor: an empty pre/post pair). Part 2, per-op CPU µs on the fake
backend (the whole dispatch path, a 1-element all_reduce): no tracing (anchor), flight
recorder, logs (default info level), spans (OTLP file; the export thread's CPU counts), and
the default-on set (flight recorder + logs). Part 3, a 1 MiB all_reduce on gloo with 2 real
ranks: no tracing (anchor) vs the default-on set, wall time in paired rounds, as % overhead.
CPU time keeps parts 1-2 meaningful on a shared machine. Everything is measured in one run;
prints tables and writes JSON.

    python benchmarks/trace_overhead.py [--ops 20000] [--repeats 7] [--gloo-iters 200] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["TORCHCOMM_TRACING_DISABLE"] = "1"  # attach each part by hand below

from tests.helpers.ports import free_port  # noqa: E402 - after the repository is on the path


def _fake_comm(name: str):  # type: ignore[no-untyped-def]
    import torchcomms

    return torchcomms.new_comm("fake", "cpu", name, hints={"rank": "0", "size": "2"})


def _per_op_us(comm, n: int, repeats: int) -> float:  # type: ignore[no-untyped-def]
    import torch

    import torchcomms

    t = torch.ones(1)
    op = torchcomms.ReduceOp.SUM
    for _ in range(min(n, 2000)):
        comm.all_reduce(t, op, False)
    samples = []
    for _ in range(repeats):
        t0 = time.process_time_ns()  # CPU time of the process (all threads), robust to load
        for _ in range(n):
            comm.all_reduce(t, op, False)
        samples.append((time.process_time_ns() - t0) / n / 1e3)
    return statistics.median(samples)


def _hook_loop(pre, post, recs, n: int) -> float:  # type: ignore[no-untyped-def]
    """Call a pre/post hook pair the way the dispatch path does, from two frames deep."""

    def dispatch(rec, i):  # type: ignore[no-untyped-def]
        pre(rec.name, i, rec)
        rec.state = "completed"
        post(i, rec)

    def user_call(rec, i):  # type: ignore[no-untyped-def]
        dispatch(rec, i)

    t0 = time.thread_time_ns()  # CPU time of this thread: what the hooks cost, not the machine's load
    for i in range(n):
        user_call(recs[i], i)
    return (time.thread_time_ns() - t0) / n / 1e3


def part_hooks(n: int, repeats: int, tmp: Path) -> list[dict]:
    """The hooks alone on real OpRecords (no dispatch path around them): the cleanest per-op
    cost of each part; the anchor is an empty pre/post pair."""
    from torchcomms.core.op import OpRecord
    from torchcomms.tracing import logging as tlog
    from torchcomms.tracing.flight_recorder import FlightRecorder
    from torchcomms.tracing.spans import OTLPJsonLinesExporter, SpanRecorder
    from torchcomms.core.types import OpName

    tlog.configure_logging(level="info", fmt="json", stream=open(os.devnull, "w"), force=True)  # noqa: SIM115

    def records() -> list:
        out = []
        for i in range(n):
            r = OpRecord("dp", (0, 1), 0, 2, "gloo", OpName.all_reduce, i + 1, i + 1, 600.0, False, time.time_ns())
            r.input_sizes = r.output_sizes = [[262144]]
            r.input_dtypes = r.output_dtypes = ["float32"]
            r.state = "started"
            r.time_started_ns = r.time_created_ns
            r.time_completed_ns = r.time_created_ns + 1000
            out.append(r)
        return out

    fr = FlightRecorder(2048)
    log = tlog.LogHook("dp")
    spans = SpanRecorder(OTLPJsonLinesExporter(tmp / "hook-spans.jsonl"), run_id="bench", rank=0)

    def nop_pre(name, i, rec):  # type: ignore[no-untyped-def]
        return None

    def nop_post(i, rec):  # type: ignore[no-untyped-def]
        return None

    def both_pre(name, i, rec):  # type: ignore[no-untyped-def]
        fr.pre_hook(name, i, rec)
        log.pre(name, i, rec)

    def both_post(i, rec):  # type: ignore[no-untyped-def]
        fr.post_hook(i, rec)
        log.post(i, rec)

    configs = {
        "none (anchor)": (nop_pre, nop_post),
        "flight recorder": (fr.pre_hook, fr.post_hook),
        "logs (info)": (log.pre, log.post),
        "spans (post-hook enqueue)": (nop_pre, spans.post_hook),
        "default (fr + logs)": (both_pre, both_post),
    }
    samples: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(repeats):
        for name, (pre, post) in configs.items():
            samples[name].append(_hook_loop(pre, post, records(), n))
            spans.flush(120)
    spans.shutdown()
    anchor = statistics.median(samples["none (anchor)"])
    rows = []
    for name, vals in samples.items():
        us = statistics.median(vals)
        rows.append({"config": name, "us_per_op": us, "added_us": us - anchor, "ratio_vs_anchor": us / anchor})
    rows.append({"config": "spans dropped", "value": spans.dropped})
    return rows


def part_fake(n: int, repeats: int, tmp: Path) -> list[dict]:
    from torchcomms.tracing import logging as tlog
    from torchcomms.tracing.flight_recorder import FlightRecorder
    from torchcomms.tracing.spans import OTLPJsonLinesExporter, SpanRecorder, attach_spans

    tlog.configure_logging(level="info", fmt="json", stream=open(os.devnull, "w"), force=True)  # noqa: SIM115
    configs = {}

    base = _fake_comm("b-none")
    configs["none (anchor)"] = base

    c = _fake_comm("b-fr")
    FlightRecorder(2048).attach(c)
    configs["flight recorder"] = c

    c = _fake_comm("b-logs")
    tlog.attach_logging(c)
    configs["logs (info)"] = c

    c = _fake_comm("b-spans")
    spans = SpanRecorder(OTLPJsonLinesExporter(tmp / "spans.jsonl"), run_id="bench", rank=0)
    attach_spans(c, spans)
    configs["spans (OTLP file)"] = c

    c = _fake_comm("b-default")
    FlightRecorder(2048).attach(c)
    tlog.attach_logging(c)
    configs["default (fr + logs)"] = c

    results: dict[str, list[float]] = {name: [] for name in configs}
    rounds = max(10, repeats * 5)
    per_round = max(200, n // rounds)
    for i in range(rounds):  # many short interleaved rounds, order reversed every other one
        order = list(configs.items()) if i % 2 == 0 else list(reversed(configs.items()))
        for name, comm in order:
            results[name].append(_per_op_us(comm, per_round, 1))
            if name.startswith("spans"):
                spans.flush(60)
    spans.shutdown()
    anchor = statistics.median(results["none (anchor)"])
    anchor_min = min(results["none (anchor)"])
    rows = []
    for name, vals in results.items():
        us, lo = statistics.median(vals), min(vals)
        q = statistics.quantiles(vals, n=4)
        rows.append({
            "config": name, "us_per_op": us, "added_us": us - anchor, "ratio_vs_anchor": us / anchor,
            "min_us_per_op": lo, "added_us_min": lo - anchor_min, "ratio_vs_anchor_min": lo / anchor_min,
            "iqr_us": q[2] - q[0], "rounds": len(vals),
        })
    rows.append({"config": "spans dropped", "value": spans.dropped})
    return rows


def gloo_rank(iters: int, out: str) -> None:
    """One rank of part 2 (run by the parent through ``--gloo-rank``)."""
    import torch

    import torchcomms
    from torchcomms.tracing import logging as tlog
    from torchcomms.tracing.flight_recorder import FlightRecorder

    tlog.configure_logging(level="info", fmt="json", stream=open(os.devnull, "w"), force=True)  # noqa: SIM115
    base = torchcomms.new_comm("gloo", torch.device("cpu"), "g-none")
    traced = torchcomms.new_comm("gloo", torch.device("cpu"), "g-traced")
    FlightRecorder(2048).attach(traced)
    tlog.attach_logging(traced)
    t = torch.ones(262144)  # 1 MiB of float32
    op = torchcomms.ReduceOp.SUM
    samples: dict[str, list[float]] = {"none": [], "traced": []}
    for comm in (base, traced):
        for _ in range(20):
            comm.all_reduce(t, op, False)
    rounds = max(4, iters // 10)
    per_round = max(1, iters // rounds)
    for i in range(rounds):  # paired rounds, ABBA order so drift cancels
        pairs = (("none", base), ("traced", traced)) if i % 2 == 0 else (("traced", traced), ("none", base))
        for key, comm in pairs:
            comm.barrier(False)
            t0 = time.perf_counter()
            for _ in range(per_round):
                comm.all_reduce(t, op, False)
            samples[key].append((time.perf_counter() - t0) / per_round * 1e6)
    Path(out).write_text(json.dumps(samples))
    base.finalize()
    traced.finalize()


def part_gloo(iters: int, tmp: Path) -> list[dict]:
    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, TORCHCOMM_RANK=str(r), TORCHCOMM_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
        env.pop("TORCHCOMM_CONTROL_ADDR", None)
        procs.append(subprocess.Popen([sys.executable, __file__, "--gloo-rank", str(tmp / f"g{r}.json"), "--gloo-iters", str(iters)], env=env))
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise SystemExit(f"gloo rank exited with {p.returncode}")
    data = json.loads((tmp / "g0.json").read_text())
    # paired rounds: overhead of each round against its own anchor, median across rounds
    pct = [(t - n) / n * 100 for n, t in zip(data["none"], data["traced"])]
    none, traced = statistics.median(data["none"]), statistics.median(data["traced"])
    q = statistics.quantiles(pct, n=4)
    return [
        {"config": "none (anchor)", "us_per_op": none, "min_us_per_op": min(data["none"]), "ratio_vs_anchor": 1.0},
        {"config": "default (fr + logs)", "us_per_op": traced, "min_us_per_op": min(data["traced"]), "ratio_vs_anchor": traced / none,
         "overhead_pct_median_of_rounds": statistics.median(pct), "overhead_pct_iqr": [q[0], q[2]], "rounds": len(pct)},
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--gloo-iters", type=int, default=600)
    ap.add_argument("--json", default="trace_overhead.json")
    ap.add_argument("--gloo-rank", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.gloo_rank:
        gloo_rank(a.gloo_iters, a.gloo_rank)
        return
    from rich.console import Console
    from rich.table import Table

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        hooks = part_hooks(a.ops, a.repeats, tmp)
        fake = part_fake(a.ops, a.repeats, tmp)
        gloo = part_gloo(a.gloo_iters, tmp)
    con = Console(width=170)
    t = Table(title=f"Hooks alone on real OpRecords (median of {a.repeats} rounds of {a.ops} ops)")
    for col in ("config", "CPU µs/op", "added µs/op", "ratio vs none"):
        t.add_column(col, justify="right")
    for r in hooks:
        if "us_per_op" in r:
            t.add_row(r["config"], f"{r['us_per_op']:.3f}", f"{r['added_us']:+.3f}", f"{r['ratio_vs_anchor']:.2f}")
    con.print(t)
    t = Table(title=f"Whole dispatch path on the fake backend (1-element all_reduce, {a.ops} ops in interleaved rounds)")
    for col in ("config", "CPU µs/op median", "IQR", "added (median)", "ratio (median)", "CPU µs/op min", "ratio (min)"):
        t.add_column(col, justify="right")
    for r in fake:
        if "us_per_op" in r:
            t.add_row(r["config"], f"{r['us_per_op']:.2f}", f"{r['iqr_us']:.2f}", f"{r['added_us']:+.2f}", f"{r['ratio_vs_anchor']:.3f}",
                      f"{r['min_us_per_op']:.2f}", f"{r['ratio_vs_anchor_min']:.3f}")
    con.print(t)
    dropped = next(r["value"] for r in fake if r["config"] == "spans dropped")
    con.print(f"spans dropped: {dropped}")
    t = Table(title=f"1 MiB float32 all_reduce, gloo, 2 ranks on this host ({a.gloo_iters} ops per config)")
    for col in ("config", "µs/op median (rank 0)", "µs/op min", "ratio vs none", "overhead % (median of paired rounds)", "IQR of %"):
        t.add_column(col, justify="right")
    for r in gloo:
        iqr = r.get("overhead_pct_iqr")
        t.add_row(r["config"], f"{r['us_per_op']:.1f}", f"{r['min_us_per_op']:.1f}", f"{r['ratio_vs_anchor']:.4f}",
                  f"{r.get('overhead_pct_median_of_rounds', 0.0):+.2f}", f"{iqr[0]:+.1f} .. {iqr[1]:+.1f}" if iqr else "")
    con.print(t)
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    con.print(f"load average during the run: {load}")
    out = {
        "benchmark": "trace_overhead",
        "load_average": load,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"host": platform.node(), "cpu_count": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "hooks_alone": hooks,
        "fake_backend": fake,
        "gloo_1mib_all_reduce": gloo,
    }
    Path(a.json).write_text(json.dumps(out, indent=2))
    con.print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
