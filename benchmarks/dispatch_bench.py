"""Cost of torchcomms' dispatch path per op, measured on the fake backend (no engine).

    python3 benchmarks/dispatch_bench.py                  # table + JSON
    python3 benchmarks/dispatch_bench.py --profile 20     # plus cProfile's top 20 per variant

Contenders, each timed as a loop of ``--ops`` calls per round, in ``--rounds`` rounds whose
order is shuffled every round. The table shows the median over rounds of the mean per call in
wall time, the best (least disturbed) round, and the median in the thread's CPU time (which
leaves out time spent descheduled). Rounds are short by default so that on a shared,
overloaded machine many of them run undisturbed. "− floor" is the dispatch path's own cost:

- ``floor``: a bare Python function doing exactly the fake backend's work for an all_reduce
  (SUM on a world of 2: ``t.copy_(t * 2)``) — the anchor; the dispatch path's cost is the
  difference to it;
- ``sync``: ``comm.all_reduce(t, ReduceOp.SUM, async_op=False)`` on ``new_comm("fake", ...)``;
- ``async+wait``: ``comm.all_reduce(t, ReduceOp.SUM, async_op=True).wait()``;

each with default tracing (flight recorder + log hooks, as ``new_comm`` attaches them) and with
``TORCHCOMM_TRACING_DISABLE=1`` at creation. For context, when torch ships it, c10d's own
``dist.all_reduce`` on its ``fake`` process group (which does no data work at all).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import torchcomms  # noqa: E402
from torchcomms import ReduceOp  # noqa: E402

FLOOR = "floor"
GOAL_US = 15.0
WORLD = 2


def new_fake_comm(name: str, tracing: bool) -> Any:
    """A fake-backend communicator (rank 0 of 2); tracing follows TORCHCOMM_TRACING_DISABLE,
    which ``new_comm`` reads at creation."""
    saved = os.environ.get("TORCHCOMM_TRACING_DISABLE")
    os.environ["TORCHCOMM_TRACING_DISABLE"] = "0" if tracing else "1"
    try:
        return torchcomms.new_comm("fake", torch.device("cpu"), name=name,
                                   hints={"rank": "0", "size": str(WORLD)})
    finally:
        if saved is None:
            del os.environ["TORCHCOMM_TRACING_DISABLE"]
        else:
            os.environ["TORCHCOMM_TRACING_DISABLE"] = saved


def fake_all_reduce_work(t: torch.Tensor) -> None:
    """What the fake backend computes for all_reduce(SUM) on 2 ranks, called directly."""
    t.copy_(t * WORLD)


def c10d_fake_all_reduce() -> Callable[[torch.Tensor], object] | None:
    """``dist.all_reduce`` on c10d's fake process group, or None where torch lacks it."""
    try:
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except Exception:  # noqa: BLE001 - optional context row
        return None
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    return lambda t: dist.all_reduce(t)


def build_contenders(include_c10d: bool) -> tuple[dict[str, Callable[[], object]], list[Any]]:
    """Name -> zero-argument callable doing one op; plus the comms to finalize."""
    tensor = torch.zeros(4)  # zeros: SUM keeps it at zero forever, so every call does the same work
    traced = new_fake_comm("dispatch-traced", tracing=True)
    plain = new_fake_comm("dispatch-notrace", tracing=False)
    contenders: dict[str, Callable[[], object]] = {
        FLOOR: lambda: fake_all_reduce_work(tensor),
        "sync, no tracing": lambda: plain.all_reduce(tensor, ReduceOp.SUM, False),
        "sync, tracing": lambda: traced.all_reduce(tensor, ReduceOp.SUM, False),
        "async+wait, no tracing": lambda: plain.all_reduce(tensor, ReduceOp.SUM, True).wait(),
        "async+wait, tracing": lambda: traced.all_reduce(tensor, ReduceOp.SUM, True).wait(),
    }
    if include_c10d:
        c10d = c10d_fake_all_reduce()
        if c10d is not None:
            contenders["c10d dist.all_reduce, fake pg (no data work)"] = lambda: c10d(tensor)
    return contenders, [traced, plain]


def time_loop(fn: Callable[[], object], ops: int) -> tuple[float, float]:
    """Mean (wall, thread CPU) seconds per call over ``ops`` back-to-back calls. CPU time
    leaves out the time the thread sat descheduled, which dominates wall time on a busy box."""
    c0 = time.thread_time_ns()
    t0 = time.perf_counter_ns()
    for _ in range(ops):
        fn()
    t1 = time.perf_counter_ns()
    c1 = time.thread_time_ns()
    return (t1 - t0) / ops / 1e9, (c1 - c0) / ops / 1e9


def measure(contenders: dict[str, Callable[[], object]], rounds: int, ops: int,
            seed: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(wall, cpu) samples per contender: one mean per round, rounds in shuffled order."""
    rng = random.Random(seed)
    for fn in contenders.values():  # warm up: first-call costs (imports, caches) stay out
        time_loop(fn, max(10, ops // 10))
    wall: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        order = list(contenders)
        rng.shuffle(order)
        for name in order:
            w, c = time_loop(contenders[name], ops)
            wall[name].append(w)
            cpu[name].append(c)
    return wall, cpu


def profile(fn: Callable[[], object], ops: int, top: int) -> tuple[str, list[dict[str, Any]]]:
    """cProfile ``ops`` calls; the top entries by own time, as text and as rows."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(ops):
        fn()
    prof.disable()
    stats = pstats.Stats(prof)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    rows = []
    for (file, line, func), (cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}({func})", "calls_per_op": nc / ops,
                     "own_us_per_op": tt / ops * 1e6, "cumulative_us_per_op": ct / ops * 1e6})
    rows.sort(key=lambda r: r["own_us_per_op"], reverse=True)
    return buf.getvalue(), rows[:top]


def summarize(wall: dict[str, list[float]], cpu: dict[str, list[float]]) -> list[dict[str, Any]]:
    wall_floor = statistics.median(wall[FLOOR]) * 1e6
    cpu_floor = statistics.median(cpu[FLOOR]) * 1e6
    best_floor = min(wall[FLOOR]) * 1e6
    out = []
    for name in wall:
        w = [x * 1e6 for x in wall[name]]
        c = [x * 1e6 for x in cpu[name]]
        med, cmed = statistics.median(w), statistics.median(c)
        q = statistics.quantiles(w, n=10) if len(w) >= 2 else [med] * 9
        out.append({"contender": name, "us_per_op": med, "p10_us": q[0], "p90_us": q[-1],
                    "over_floor_us": med - wall_floor, "x_floor": med / wall_floor,
                    "best_us_per_op": min(w), "best_over_floor_us": min(w) - best_floor,
                    "cpu_us_per_op": cmed, "cpu_over_floor_us": cmed - cpu_floor})
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| contender | wall µs/op (median) | wall p10–p90 | wall − floor | ratio to floor | best round µs/op "
          "| best − floor | CPU µs/op | CPU − floor |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        floor = r["contender"] == FLOOR

        def over(key: str) -> str:
            return "—" if floor else f"{r[key]:.1f}"

        print(f"| {r['contender']} | {r['us_per_op']:.2f} | {r['p10_us']:.1f}–{r['p90_us']:.1f} | "
              f"{over('over_floor_us')} | {r['x_floor']:.2f}x | {r['best_us_per_op']:.2f} | {over('best_over_floor_us')} | "
              f"{r['cpu_us_per_op']:.2f} | {over('cpu_over_floor_us')} |")
    print("\nmedian: over rounds of the mean per call; best round: the fastest round (least disturbed by "
          "other load); CPU: the thread's CPU time; − floor: the dispatch path's own cost; ratio to floor: "
          "median / the floor's median")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200, help="rounds (default 200)")
    p.add_argument("--ops", type=int, default=100, help="calls per contender per round (default 100)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also cProfile the torchcomms variants and print the top N by own time")
    p.add_argument("--profile-calls", type=int, default=5000, help="calls under the profiler (default 5000)")
    p.add_argument("--no-c10d", action="store_true", help="leave out c10d's fake process group row")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="dispatch_bench.json", help="where to write the results")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.ops < 1:
        p.error(f"--rounds and --ops must be >= 1, got {args.rounds} and {args.ops}")
    if args.profile < 0 or args.profile_calls < 1:
        p.error(f"--profile must be >= 0 and --profile-calls >= 1, got {args.profile} and {args.profile_calls}")

    started = datetime.now(timezone.utc)
    load_before = os.getloadavg()
    contenders, comms = build_contenders(include_c10d=not args.no_c10d)
    wall, cpu = measure(contenders, args.rounds, args.ops, args.seed)
    rows = summarize(wall, cpu)
    profiles: dict[str, Any] = {}
    texts: list[str] = []
    if args.profile:
        for name in ("sync, no tracing", "sync, tracing", "async+wait, tracing"):
            text, top = profile(contenders[name], args.profile_calls, args.profile)
            profiles[name] = top
            texts.append(f"\n### cProfile: {name} ({args.profile_calls} calls, top {args.profile} by own time)\n{text}")
    for comm in comms:
        comm.finalize()

    meta = {
        "benchmark": "dispatch_bench",
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(["python3", "benchmarks/dispatch_bench.py", *argv]),
        "machine": {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "rounds": args.rounds,
        "ops_per_round": args.ops,
        "goal_us": GOAL_US,
        "note": "median over shuffled rounds of the mean per call; dispatch = op - floor",
    }
    print(f"dispatch_bench: fake backend, all_reduce of 4 float32, {args.rounds} rounds x {args.ops} calls; "
          f"{started:%Y-%m-%d %H:%M} UTC, load {load_before[0]:.1f} -> {meta['loadavg_after'][0]:.1f}, "
          f"torch {torch.__version__}")
    print_table(rows)
    ours = [r for r in rows if r["contender"] != FLOOR and not r["contender"].startswith("c10d")]
    for key, label in (("over_floor_us", "median wall"), ("best_over_floor_us", "best-round wall"),
                       ("cpu_over_floor_us", "median CPU")):
        worst = max(ours, key=lambda r: r[key])
        print(f"goal (dispatch <= {GOAL_US:g} µs/op), {label} time: worst {worst['contender']} "
              f"{worst[key]:.1f} µs -> {'met' if worst[key] <= GOAL_US else 'NOT met'}")
    for text in texts:
        print(text)
    Path(args.json).write_text(json.dumps(
        {"meta": meta, "results": rows, "samples_us": {k: [x * 1e6 for x in v] for k, v in wall.items()},
         "cpu_samples_us": {k: [x * 1e6 for x in v] for k, v in cpu.items()}, "profiles": profiles}, indent=1))
    print(f"-> {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
