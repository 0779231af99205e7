"""torchcomms-run vs torchrun: job wall time, and failure-notification latency.

Wall time of ``torchcomms-run --nproc-per-node 2`` against
``torchrun --standalone --nproc-per-node 2`` on (a) a no-op script and (b) a 2-rank
``init_process_group("gloo")`` + ``all_reduce`` script, in interleaved runs (the order of the
two alternates each round), reported as medians and their ratio. Both launchers run through
the same interpreter (``python -m launcher`` / ``python -m torch.distributed.run``) so that
neither pays for a console-script shim.

Then the time from a worker's SIGKILL to a surviving worker's ``rank_failed`` notification
over the job's event bus (the victim writes its clock just before killing itself; the
survivor, subscribed with the job secret, notes when the event arrives).

    python benchmarks/launcher_bench.py --rounds 10 --notify-rounds 20 --json out/launcher_bench.json
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

NOOP = "pass\n"
ALL_REDUCE = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.destroy_process_group()
"""
NOTIFY = """\
import os, signal, threading, time
from pathlib import Path
from torchcomms.control.client import ControlClient
from torchcomms.control.secrets import load_secret
rank = int(os.environ["RANK"])
out = Path(os.environ["BENCH_OUT"])
client = ControlClient(os.environ["TORCHCOMM_CONTROL_ADDR"], load_secret(), timeout=30)
if rank == 1:
    client.get("bench/listening", timeout=30)
    time.sleep(0.05)
    (out / "death").write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)
got = threading.Event()
seen = {}
def on_event(topic, payload):
    if topic == "rank_failed" and payload.get("rank") == 1 and not got.is_set():
        seen["t"] = time.time()
        got.set()
sub = client.subscribe(None, on_event, since=None)
client.set("bench/listening", b"1")
assert got.wait(30)
(out / "latency").write_text(repr(seen["t"] - float((out / "death").read_text())))
sub.close()
client.close()
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith(("TORCHCOMM_", "TORCHELASTIC_")):
            del env[key]
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return dt


def bench_wall(script: Path, rounds: int, env: dict[str, str]) -> dict[str, object]:
    ours_cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", "2", "--no-summary",
                str(script)]
    theirs_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                  "--nproc-per-node", "2", str(script)]
    ours, theirs = [], []
    _timed(ours_cmd, env), _timed(theirs_cmd, env)  # warm the page cache for both
    for i in range(rounds):
        pair = [(ours_cmd, ours), (theirs_cmd, theirs)]
        for cmd, sink in (pair if i % 2 == 0 else pair[::-1]):
            sink.append(_timed(cmd, env))
    mo, mt = statistics.median(ours), statistics.median(theirs)
    return {"ours_s": ours, "torchrun_s": theirs, "ours_median_s": mo,
            "torchrun_median_s": mt, "ratio": mo / mt}


def bench_notify(script: Path, rounds: int, env: dict[str, str]) -> dict[str, object]:
    lat = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as d:
            e = dict(env, BENCH_OUT=d)
            cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", "2", "--on-failure",
                   "shrink", "--no-summary", str(script)]
            _timed(cmd, e)
            lat.append(float(Path(d, "latency").read_text()))
    lat.sort()
    return {"latency_s": lat, "median_s": statistics.median(lat),
            "p90_s": lat[min(len(lat) - 1, int(0.9 * len(lat)))], "max_s": lat[-1]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10, help="interleaved runs per script")
    p.add_argument("--notify-rounds", type=int, default=20)
    p.add_argument("--json", default="out/launcher_bench.json", help="where to write results")
    args = p.parse_args()
    env = _env()
    with tempfile.TemporaryDirectory() as d:
        scripts = {name: Path(d, f"{name}.py") for name in ("noop", "all_reduce", "notify")}
        scripts["noop"].write_text(NOOP)
        scripts["all_reduce"].write_text(ALL_REDUCE)
        scripts["notify"].write_text(NOTIFY)
        results = {
            "noop": bench_wall(scripts["noop"], args.rounds, env),
            "all_reduce": bench_wall(scripts["all_reduce"], args.rounds, env),
            "notify": bench_notify(scripts["notify"], args.notify_rounds, env),
        }
    import torch  # only for the record of which torch ran the anchor

    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
            "python": platform.python_version(), "torch": torch.__version__,
            "rounds": args.rounds, "notify_rounds": args.notify_rounds}
    print(f"launcher benchmark — {meta['machine']}, Python {meta['python']}, "
          f"torch {meta['torch']}, {args.rounds} interleaved rounds")
    print(f"{'workload (2 workers)':<28}{'torchcomms-run':>16}{'torchrun':>12}{'ratio':>8}")
    for name, label in (("noop", "no-op script"), ("all_reduce", "gloo init + all_reduce")):
        r = results[name]
        print(f"{label:<28}{r['ours_median_s']:>15.3f}s{r['torchrun_median_s']:>11.3f}s"
              f"{r['ratio']:>7.2f}x")
    n = results["notify"]
    print(f"{'SIGKILL -> rank_failed':<28}{n['median_s'] * 1e3:>13.1f} ms{'(none)':>12}"
          f"{'':>8}   p90 {n['p90_s'] * 1e3:.1f} ms, max {n['max_s'] * 1e3:.1f} ms, "
          f"{args.notify_rounds} runs")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
