"""Recovery time after a SIGKILL: torchcomms (detect → shrink → first all_reduce on the
survivors, under ``torchcomms-run --on-failure shrink``) against torchrun's restart of the same
job (kill → the restarted group's first all_reduce), measured in the same run; plus the time to
detect a stopped (SIGSTOPped) rank; plus false kills: the README's main job (and, with
``--false-kill-elastic``, its elastic example without a failure) run ``--false-kill-runs`` times
while the CPU is oversubscribed (``--per-core`` busy processes per core), beside the same job
under torchrun (which has no hang detection, so it cannot kill falsely: the anchor for "the
job itself passes under this load"). With ``--engines gloo mpi`` (or ``mpi`` alone) the same
SIGKILL on the mpi backend under ``mpiexec --with-ft ulfm`` (ULFM: revoke → shrink → agree →
first all_reduce) is timed in the same run and table.

    python3 benchmarks/recovery_bench.py --worlds 4 8 --repeats 3 --json out/recovery.json
    python3 benchmarks/recovery_bench.py --worlds --false-kill-runs 20   # false kills only
    python3 benchmarks/recovery_bench.py --engines gloo mpi --worlds 8 --repeats 5 --false-kill-runs 0
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
CHAOS = REPO / "tests" / "recovery" / "chaos_worker.py"
RESTART = REPO / "benchmarks" / "restart_worker.py"


def _wait_files(paths: list[Path], proc: subprocess.Popen, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while not all(p.exists() for p in paths):
        if proc.poll() is not None or time.monotonic() > deadline:
            return all(p.exists() for p in paths)
        time.sleep(0.05)
    return True


def _run_job(cmd: list[str], env: dict[str, str], results: list[Path],
             before_reap: Callable[[], None] | None = None) -> bool:
    """Start a job in its own session, wait (240 s at most) for its result files, give it 60 s
    to exit (after ``before_reap``), kill what is left. True if every result file appeared."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    ok = _wait_files(results, proc, 240)
    try:
        if before_reap is not None:
            before_reap()
        proc.wait(60)
    except subprocess.TimeoutExpired:
        pass  # killed below; what it wrote is the result (stock torchrun can hang after a failed restart)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return ok


def torchcomms_run(world: int, sig: str) -> dict:
    out = Path(tempfile.mkdtemp(prefix="tc-rbench-"))
    victim = world - 1
    cfg = {"op": "all_reduce", "victim": victim, "signal": sig, "when": "inside", "step": 3, "dir": str(out),
           "timeout_s": 60}
    env = dict(os.environ, TC_CHAOS_CFG=json.dumps(cfg), TORCHCOMM_TRACING_DISABLE="1", PYTHONPATH=str(REPO))
    survivors = [r for r in range(world) if r != victim]

    def reap_stopped_victim() -> None:  # a stopped rank is excluded, then killed here
        if sig == "STOP" and (out / f"failed{victim}.json").exists():
            os.kill(json.loads((out / f"failed{victim}.json").read_text())["pid"], signal.SIGKILL)

    ok = _run_job([sys.executable, "-m", "launcher", "--nproc-per-node", str(world), "--on-failure", "shrink",
                   "--no-summary", str(CHAOS)], env, [out / f"result{r}.json" for r in survivors],
                  reap_stopped_victim)
    if not ok:
        return {"ok": False}
    t_fail = json.loads((out / f"failed{victim}.json").read_text())["t"]
    res = [json.loads((out / f"result{r}.json").read_text()) for r in survivors]
    return {
        "ok": all(r.get("first_ok") for r in res),
        "detect_ms": max(r["t_detect"] - t_fail for r in res) * 1e3,
        "shrink_ms": max(r["t_shrunk"] - t_fail for r in res) * 1e3,
        "first_op_ms": max(r["t_first_op"] - t_fail for r in res) * 1e3,
    }


def torchrun_restart(world: int, prefix_workaround: bool = True) -> dict:
    out = Path(tempfile.mkdtemp(prefix="tc-rbench-tr-"))
    env = dict(os.environ, TC_BENCH_DIR=str(out), TC_VICTIM=str(world - 1), PYTHONPATH=str(REPO),
               TC_ATTEMPT_PREFIX="1" if prefix_workaround else "0")
    ok = _run_job([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
                   "--max-restarts", "1", str(RESTART)], env, [out / "t_first.json"])
    if not ok:
        return {"ok": False}
    first = json.loads((out / "t_first.json").read_text())
    t_fail = json.loads((out / "t_fail.json").read_text())["t"]
    return {"ok": bool(first["ok"]), "first_op_ms": (first["t"] - t_fail) * 1e3}


MAIN_JOB = ["examples/train_ddp.py", "--steps", "40"]
ELASTIC_JOB = ["examples/elastic_train.py", "--steps", "40"]
#: what the agent prints when it ends a rank on a liveness verdict
VERDICTS = ("is hung", "is stopped")


def one_job(job: list[str], nproc: int, torchrun: bool) -> dict:
    """Run ``job`` once; did it pass, and did the launcher take a healthy rank for hung or
    stopped (a false kill: nothing in these jobs fails on purpose)?"""
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone"] if torchrun
                else [sys.executable, "-m", "launcher", "--no-summary"])
    env = dict(os.environ, PYTHONPATH=str(REPO), TORCHCOMM_TRACING_DISABLE="1")
    t0 = time.monotonic()
    try:
        proc = subprocess.run([*launcher, "--nproc-per-node", str(nproc), *job], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, rc = str(exc.stderr or ""), -1
    return {"ok": rc == 0, "rc": rc, "s": time.monotonic() - t0,
            "tail": "" if rc == 0 else out[-3000:],
            "false_kill": any(v in out for v in VERDICTS),
            "control_lost": "event subscription interrupted" in out}


def false_kills(runs: int, per_core: int, elastic: bool, anchor: bool) -> dict:
    from tests.helpers.cpu_load import oversubscribed

    jobs = {"main": (MAIN_JOB, 2)}
    if elastic:
        jobs["elastic"] = (ELASTIC_JOB, 4)
    found: dict[str, list[dict]] = {f"{k}/{who}": [] for k in jobs
                                    for who in (("ours", "torchrun") if anchor else ("ours",))}
    with oversubscribed(per_core=per_core, limit_s=runs * len(found) * 620) as burners:
        for i in range(runs):  # interleaved, so both see the same load
            for name, (job, nproc) in jobs.items():
                found[f"{name}/ours"].append(one_job(job, nproc, torchrun=False))
                if anchor:
                    found[f"{name}/torchrun"].append(one_job(job, nproc, torchrun=True))
                r = found[f"{name}/ours"][-1]
                print(f"  run {i + 1}/{runs} {name}: ours rc {r['rc']} in {r['s']:.0f} s"
                      f"{' FALSE KILL' if r['false_kill'] else ''}", flush=True)
    return {"burners": burners, "per_core": per_core, "runs": runs, "jobs": found}


def print_false_kills(fk: dict) -> None:
    print(f"\nfalse kills under oversubscription ({fk['burners']} busy processes, "
          f"{fk['per_core']} per core)")
    hdr = f"{'job':<18} {'passed':>8} {'false kills':>12} {'control lost':>13} {'median s':>9}"
    print(hdr)
    print("-" * len(hdr))
    for name, rs in fk["jobs"].items():
        print(f"{name:<18} {sum(r['ok'] for r in rs):>4}/{len(rs):<3} "
              f"{sum(r['false_kill'] for r in rs):>12} {sum(r['control_lost'] for r in rs):>13} "
              f"{med([r['s'] for r in rs]):>9.0f}")


def mpi_ulfm_run(world: int, seed: int) -> dict:
    """SIGKILL of one rank of an MPI job at a random instant of its all_reduce loop; times (from
    the kill) until the slowest survivor's typed error, shrunk communicator and first all_reduce."""
    import random

    sys.path.insert(0, str(REPO))
    from tests.helpers.mpi_ranks import MpiJob

    victim = world - 1
    survivors = [r for r in range(world) if r != victim]
    with MpiJob(world, "tests.mpi.workers:ops_until_failure", {"timeout_s": 60.0, "limit_s": 120.0},
                env={"TORCHCOMM_TRACING_DISABLE": "1"}, ulfm=True) as job:
        try:
            job.wait_ready(list(range(world)))
            time.sleep(random.Random(seed).uniform(0.0, 0.2))
            pid = job.pid_of(victim)
            t_fail = time.monotonic()  # the ranks' clock: time.monotonic() is one clock per host
            os.kill(pid, signal.SIGKILL)
            res = [r.value for r in job.results_of(survivors, timeout=240)]
        except AssertionError as e:
            return {"ok": False, "why": f"a survivor failed: {e}"[:2000]}
    if any(v is None or "t_first_op" not in v for v in res):
        return {"ok": False, "why": f"a survivor did not recover: {res}"[:2000]}
    wrong = [v for v in res if v["sum"] != float(sum(survivors))]
    return {
        "ok": not wrong,
        "why": f"wrong sum after the shrink: {wrong}"[:2000] if wrong else None,
        "detect_ms": max(v["t_detect"] - t_fail for v in res) * 1e3,
        "shrink_ms": max(v["t_shrunk"] - t_fail for v in res) * 1e3,
        "shrink_only_ms": max(v["t_shrunk"] - v["t_detect"] for v in res) * 1e3,
        "first_op_ms": max(v["t_first_op"] - t_fail for v in res) * 1e3,
    }


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="*", default=[4, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-torchrun", action="store_true")
    ap.add_argument("--false-kill-runs", type=int, default=3,
                    help="runs of the README's main job under oversubscription (0: none)")
    ap.add_argument("--false-kill-elastic", action="store_true",
                    help="also run the elastic example (4 ranks, no failure) that many times")
    ap.add_argument("--per-core", type=int, default=8, help="busy processes per core")
    ap.add_argument("--engines", nargs="+", default=["gloo"], choices=("gloo", "mpi"),
                    help="torchcomms engines to time (default gloo; mpi runs under mpiexec --with-ft ulfm)")
    args = ap.parse_args()
    rows = []
    gloo = "gloo" in args.engines
    for world in args.worlds:
        ours, anchor, stock, hung, mpi = [], [], [], [], []
        for i in range(args.repeats):  # interleaved: ours, torchrun (workaround), torchrun (stock), hung, mpi
            if gloo:
                ours.append(torchcomms_run(world, "KILL"))
            if not args.no_torchrun:
                anchor.append(torchrun_restart(world, True))
                stock.append(torchrun_restart(world, False))
            if gloo:
                hung.append(torchcomms_run(world, "STOP"))
            if "mpi" in args.engines:
                mpi.append(mpi_ulfm_run(world, seed=i))
        good = [o for o in ours if o["ok"]]
        tr = [a for a in anchor if a["ok"]]
        hg = [h for h in hung if h["ok"]]
        row = {
            "world": world, "runs": args.repeats,
            "ours_ok": len(good), "torchrun_ok": len(tr), "hung_ok": len(hg),
            "torchrun_stock_ok": sum(1 for a in stock if a["ok"]),
            "detect_ms": med([o["detect_ms"] for o in good]),
            "shrink_ms": med([o["shrink_ms"] for o in good]),
            "first_op_ms": med([o["first_op_ms"] for o in good]),
            "torchrun_first_op_ms": med([a["first_op_ms"] for a in tr]),
            "hung_detect_ms": med([h["detect_ms"] for h in hg]),
            "raw": {"ours": ours, "torchrun": anchor, "torchrun_stock": stock, "hung": hung, "mpi": mpi},
        }
        mg = [m for m in mpi if m["ok"]]
        row.update(mpi_ok=len(mg), mpi_detect_ms=med([m["detect_ms"] for m in mg]),
                   mpi_shrink_ms=med([m["shrink_ms"] for m in mg]),
                   mpi_shrink_only_ms=med([m["shrink_only_ms"] for m in mg]),
                   mpi_first_op_ms=med([m["first_op_ms"] for m in mg]),
                   mpi_detect_max_ms=max([m["detect_ms"] for m in mg], default=float("nan")),
                   mpi_shrink_only_max_ms=max([m["shrink_only_ms"] for m in mg], default=float("nan")))
        row["speedup"] = row["torchrun_first_op_ms"] / row["first_op_ms"] if good and tr else float("nan")
        rows.append(row)
    fk = None
    if args.false_kill_runs > 0:
        fk = false_kills(args.false_kill_runs, args.per_core, args.false_kill_elastic,
                         anchor=not args.no_torchrun)
    if fk is not None:
        print_false_kills(fk)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"recovery": rows, "false_kills": fk}, indent=2))
    if not rows:
        return
    if gloo or not args.no_torchrun:
        print(f"\nrecovery after SIGKILL of one rank (medians of {args.repeats}, ms from the kill)")
        hdr = (f"{'world':>5} {'(a) detect':>11} {'(b) shrunk':>11} {'(c) 1st op':>11} {'torchrun 1st op':>16} "
               f"{'torchrun/ours':>14} {'hung detect':>12} {'ok ours/tr/hung':>16}")
        print(hdr)
        print("-" * len(hdr))
        for r in rows:
            print(f"{r['world']:>5} {r['detect_ms']:>11.1f} {r['shrink_ms']:>11.1f} {r['first_op_ms']:>11.1f} "
                  f"{r['torchrun_first_op_ms']:>16.1f} {r['speedup']:>13.1f}x {r['hung_detect_ms']:>12.1f} "
                  f"{r['ours_ok']:>6}/{r['torchrun_ok']}/{r['hung_ok']}")
    if "mpi" in args.engines:
        print(f"\nmpi (mpiexec --with-ft ulfm), same kill, same run (medians of {args.repeats}, ms from the kill; "
              "shrink alone = shrunk - detect, max over runs in brackets)")
        hdr = f"{'world':>5} {'(a) detect':>16} {'(b) shrunk':>11} {'shrink alone':>17} {'(c) 1st op':>11} {'ok':>4}"
        print(hdr)
        print("-" * len(hdr))
        for r in rows:
            print(f"{r['world']:>5} {r['mpi_detect_ms']:>7.1f} [{r['mpi_detect_max_ms']:>6.1f}] {r['mpi_shrink_ms']:>11.1f} "
                  f"{r['mpi_shrink_only_ms']:>7.1f} [{r['mpi_shrink_only_max_ms']:>6.1f}] {r['mpi_first_op_ms']:>11.1f} "
                  f"{r['mpi_ok']:>2}/{args.repeats}")
            print(f"world {r['world']} goals: every survivor's typed error <= 50 ms: max {r['mpi_detect_max_ms']:.1f} ms "
                  f"({'met' if r['mpi_detect_max_ms'] <= 50 else 'NOT met'}); shrink <= 50 ms: max "
                  f"{r['mpi_shrink_only_max_ms']:.1f} ms ({'met' if r['mpi_shrink_only_max_ms'] <= 50 else 'NOT met'}); "
                  f"first op correct in {r['mpi_ok']}/{args.repeats} runs")
            for m in r["raw"]["mpi"]:
                if not m["ok"]:
                    print(f"  world {r['world']}, failed run: {m['why']}")
    for r in rows if not args.no_torchrun else []:
        print(f"world {r['world']}: stock torchrun restart (no per-attempt prefix) succeeded "
              f"{r['torchrun_stock_ok']}/{r['runs']} times")


if __name__ == "__main__":
    main()
