"""torchcomms-run vs torchrun: job wall time, and failure-notification latency.

Wall time of ``torchcomms-run --nproc-per-node 2`` against
``torchrun --standalone --nproc-per-node 2`` on (a) a no-op script and (b) a 2-rank
``init_process_group("gloo")`` + ``all_reduce`` script, in interleaved runs (the order of the
two alternates each round), reported as medians and their ratio. Both launchers run through
the same interpreter (``python -m launcher`` / ``python -m torch.distributed.run``) so that
neither pays for a console-script shim.

Then the fork server (``--fork-server``: one process per node imports torch and torchcomms once and
forks the workers) beside the fresh-interpreter start and torchrun, in interleaved runs of the
same round: (c) the start of 2 workers of a script that imports torch and torchcomms and does one
gloo all_reduce on a ``new_comm`` communicator, and (d) the same job with ``--max-restarts 1``
where rank 1 exits 3 once after its all_reduce (every worker started twice). Wall time and the
CPU time of the whole command (its processes, from ``RUSAGE_CHILDREN``), medians.

Then the time from a worker's SIGKILL to a surviving worker's ``rank_failed`` notification
over the job's event bus (the victim writes its clock just before killing itself; the
survivor, subscribed with the job secret, notes when the event arrives).

    python benchmarks/launcher_bench.py --rounds 10 --fork-rounds 10 --notify-rounds 20 --json out/launcher_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
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
COMM = """\
import os, sys
import torch
import torchcomms
comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="bench")
t = torch.ones(1)
comm.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=False)
assert t.item() == comm.get_size()
comm.finalize()
if os.environ.get("BENCH_FAIL_ONCE") == "1" and os.environ["RANK"] == "1" \\
        and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
    sys.exit(3)
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


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system of the command and every process it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    if "--fork-server" in cmd and "fork server" in proc.stderr:  # given up: its workers started fresh
        raise SystemExit(f"{' '.join(cmd)}: the fork server did not serve:\n{proc.stderr[-2000:]}")
    return dt, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    return _run(cmd, env)[0]


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


def bench_fork(script: Path, rounds: int, env: dict[str, str], restart: bool) -> dict[str, object]:
    """Fresh interpreters, the fork server and torchrun on one job, interleaved (the order
    rotates each round)."""
    extra = ["--max-restarts", "1"] if restart else []
    env = dict(env, BENCH_FAIL_ONCE="1" if restart else "0")
    ours = [sys.executable, "-m", "launcher", "--nproc-per-node", "2", "--no-summary", *extra]
    cmds = {"fresh": [*ours, str(script)], "fork_server": [*ours, "--fork-server", str(script)],
            "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         *extra, str(script)]}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cmds}
    for cmd in cmds.values():  # warm the page cache
        _run(cmd, env)
    names = list(cmds)
    for i in range(rounds):
        for name in names[i % 3:] + names[:i % 3]:
            runs[name].append(_run(cmds[name], env))
    out: dict[str, object] = {name: {"wall_s": [w for w, _ in r], "cpu_s": [c for _, c in r],
                                     "wall_median_s": statistics.median(w for w, _ in r),
                                     "cpu_median_s": statistics.median(c for _, c in r)} for name, r in runs.items()}
    med = {name: out[name]["wall_median_s"] for name in cmds}  # type: ignore[index]
    cpu = {name: out[name]["cpu_median_s"] for name in cmds}  # type: ignore[index]
    out["ratio_vs_fresh"] = med["fork_server"] / med["fresh"]
    out["ratio_vs_torchrun"] = med["fork_server"] / med["torchrun"]
    out["cpu_ratio_vs_fresh"] = cpu["fork_server"] / cpu["fresh"]
    return out


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
    p.add_argument("--fork-rounds", type=int, default=10, help="interleaved runs of the fork-server rows")
    p.add_argument("--notify-rounds", type=int, default=20)
    p.add_argument("--only-fork", action="store_true", help="only the fork-server rows")
    p.add_argument("--json", default="out/launcher_bench.json", help="where to write results")
    args = p.parse_args()
    load_before = os.getloadavg()
    env = _env()
    with tempfile.TemporaryDirectory() as d:
        scripts = {name: Path(d, f"{name}.py") for name in ("noop", "all_reduce", "notify", "comm")}
        scripts["noop"].write_text(NOOP)
        scripts["all_reduce"].write_text(ALL_REDUCE)
        scripts["notify"].write_text(NOTIFY)
        scripts["comm"].write_text(COMM)
        results: dict[str, dict[str, object]] = {}
        if not args.only_fork:
            results["noop"] = bench_wall(scripts["noop"], args.rounds, env)
            results["all_reduce"] = bench_wall(scripts["all_reduce"], args.rounds, env)
        results["fork_start"] = bench_fork(scripts["comm"], args.fork_rounds, env, restart=False)
        results["fork_restart"] = bench_fork(scripts["comm"], args.fork_rounds, env, restart=True)
        if not args.only_fork:
            results["notify"] = bench_notify(scripts["notify"], args.notify_rounds, env)
    import torch  # only for the record of which torch ran the anchor

    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
            "python": platform.python_version(), "torch": torch.__version__,
            "rounds": args.rounds, "fork_rounds": args.fork_rounds, "notify_rounds": args.notify_rounds,
            "load_before": load_before, "load_after": os.getloadavg()}
    print(f"launcher benchmark — {meta['machine']}, Python {meta['python']}, "
          f"torch {meta['torch']}, {args.rounds} interleaved rounds, load {load_before[0]:.1f} -> "
          f"{meta['load_after'][0]:.1f}")
    if not args.only_fork:
        print(f"{'workload (2 workers)':<28}{'torchcomms-run':>16}{'torchrun':>12}{'ratio':>8}")
        for name, label in (("noop", "no-op script"), ("all_reduce", "gloo init + all_reduce")):
            r = results[name]
            print(f"{label:<28}{r['ours_median_s']:>15.3f}s{r['torchrun_median_s']:>11.3f}s"
                  f"{r['ratio']:>7.2f}x")
    print(f"\nfork server, {args.fork_rounds} interleaved rounds; wall (CPU of every process) medians")
    print(f"{'job (2 workers, torch + torchcomms, new_comm gloo all_reduce)':<62}{'--fork-server':>16}"
          f"{'fresh':>16}{'torchrun':>16}{'vs fresh':>10}{'vs torchrun':>13}")
    for name, label in (("fork_start", "start"), ("fork_restart", "--max-restarts 1, rank 1 exits 3 once")):
        r = results[name]
        cells = "".join(f"{r[k]['wall_median_s']:>7.2f}s ({r[k]['cpu_median_s']:>5.2f}s)"  # type: ignore[index]
                        for k in ("fork_server", "fresh", "torchrun"))
        print(f"{label:<62}{cells}{r['ratio_vs_fresh']:>9.2f}x{r['ratio_vs_torchrun']:>12.2f}x"
              f"   CPU vs fresh {r['cpu_ratio_vs_fresh']:.2f}x")
    if not args.only_fork:
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
