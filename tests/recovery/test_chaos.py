"""Chaos: a rank is killed, stopped or terminated (between ops, inside a collective, or while
the others shrink); every survivor raises promptly, all agree on the same survivors and
numbering, the shrunk communicator computes correctly, and nothing is left running.

A rank is also killed at a uniformly random instant of a training step that uses the agreed
pattern (``comm.agree`` on each step's outcome, shrink and redo when it says no): every
survivor ends with the same members, step counter and bitwise identical parameters.

CI runs a small matrix once. ``TC_CHAOS_FULL=1`` runs every signal × timing × op × world size
(3–8); ``TC_CHAOS_REPEAT=20`` repeats each case (the repeat mode); ``TC_CHAOS_LOAD=8`` runs
every case on one CPU beside 8 busy processes (``tests/helpers/cpu_load.py``).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.paths import child_pythonpath
from tests.helpers.cpu_load import oversubscribed
from tests.helpers.ranks import REPO
from tests.recovery.agreed_job import check_agreed, run_agreed_job

WORKER = REPO / "tests" / "recovery" / "chaos_worker.py"
DETECT_BOUND_S = 5.0  # generous for a loaded 2-core CI box; the benchmark measures the real latency

CI_CASES = [
    # (signal, when, op, world, second_victim)
    ("KILL", "between", "all_reduce", 3, False),
    ("KILL", "inside", "all_reduce", 4, False),
    ("TERM", "inside", "reduce_scatter_single", 3, False),
    ("STOP", "inside", "all_gather_single", 3, False),
    ("KILL", "inside", "barrier", 5, True),
]
if os.environ.get("TC_CHAOS_FULL"):
    CASES = [
        (sig, when, op, world, second)
        for sig, when, op, world, second in itertools.product(
            ["KILL", "STOP", "TERM"], ["between", "inside"],
            ["all_reduce", "all_gather_single", "reduce_scatter_single", "barrier"], [3, 4, 8], [False],
        )
    ] + [("KILL", "inside", "all_reduce", w, True) for w in (4, 8)]
else:
    CASES = CI_CASES
REPEAT = int(os.environ.get("TC_CHAOS_REPEAT", "1"))
LOAD_PER_CORE = int(os.environ.get("TC_CHAOS_LOAD", "0"))
STEP_WORLDS = [3, 4, 5, 6, 7, 8] if os.environ.get("TC_CHAOS_FULL") else [3, 5]
if os.environ.get("TC_CHAOS_STEP_WORLDS"):  # e.g. "4,8" for the repeat mode's sizes
    STEP_WORLDS = [int(w) for w in os.environ["TC_CHAOS_STEP_WORLDS"].split(",")]


def _load() -> contextlib.AbstractContextManager:
    return oversubscribed(per_core=LOAD_PER_CORE, limit_s=600) if LOAD_PER_CORE else contextlib.nullcontext()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def run_chaos(sig: str, when: str, op: str, world: int, second: bool, second_at: str = "agree") -> dict:
    out = Path(tempfile.mkdtemp(prefix="tc-chaos-"))
    victim = world - 2 if world > 2 else 1
    second_victim = 1 if second else -1
    cfg = {"op": op, "victim": victim, "signal": sig, "when": when, "step": 2, "dir": str(out),
           "timeout_s": 30, "second_victim": second_victim, "second_at": second_at}
    env = dict(os.environ, TC_CHAOS_CFG=json.dumps(cfg), TORCHCOMM_TRACING_DISABLE="1", PYTHONPATH=child_pythonpath())
    cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", str(world), "--on-failure", "shrink",
           "--no-summary", str(WORKER)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    victims = {victim} | ({second_victim} if second else set())
    survivors = [r for r in range(world) if r not in victims]
    deadline = time.monotonic() + 180
    try:
        while not all((out / f"result{r}.json").exists() for r in survivors):
            if proc.poll() is not None:
                break
            assert time.monotonic() < deadline, "survivors never finished"
            time.sleep(0.1)
        pids = [json.loads((out / f"pid{r}.json").read_text())["pid"] for r in range(world)
                if (out / f"pid{r}.json").exists()]
        if sig == "STOP":  # a stopped rank is excluded, then reaped by the test
            for v in victims:
                pid = json.loads((out / f"failed{v}.json").read_text())["pid"]
                os.kill(pid, signal.SIGKILL)
        rc = proc.wait(60)
        log = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    results = {r: json.loads((out / f"result{r}.json").read_text()) for r in survivors
               if (out / f"result{r}.json").exists()}
    failed_at = {v: json.loads((out / f"failed{v}.json").read_text())["t"] for v in victims
                 if (out / f"failed{v}.json").exists()}
    time.sleep(0.2)
    return {"rc": rc, "log": log, "results": results, "survivors": survivors, "failed_at": failed_at,
            "leftover": [p for p in pids if _alive(p)], "victim": victim}


@pytest.mark.parametrize("rep", range(REPEAT))
@pytest.mark.parametrize("sig,when,op,world,second", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-w{c[3]}{'-during-shrink' if c[4] else ''}" for c in CASES])
def test_survivors_shrink_and_continue(sig: str, when: str, op: str, world: int, second: bool, rep: int) -> None:
    with _load():
        run = run_chaos(sig, when, op, world, second)
    ctx = f"\n--- launcher log ---\n{run['log'][-12000:]}"
    res = run["results"]
    assert sorted(res) == run["survivors"], f"missing survivor results {sorted(res)}" + ctx
    expected = run["survivors"]
    first_failure = min(run["failed_at"].values())
    for r, v in res.items():
        assert "shrink_error" not in v, v["shrink_error"] + ctx
        assert v["raised"] in ("PeerFailureError", "CommAbortedError"), f"rank {r}: {v}" + ctx
        if v["raised"] == "PeerFailureError":  # the error names the guilty rank, even when the engine saw it first
            assert run["victim"] in v["failed_ranks"], f"rank {r} did not name rank {run['victim']}: {v}" + ctx
        assert v["t_detect"] - first_failure <= DETECT_BOUND_S, f"rank {r} detected late: {v}" + ctx
        assert v["survivors"] == expected, f"rank {r} disagrees: {v['survivors']} vs {expected}" + ctx
        assert v["new_rank"] == expected.index(r) and v["new_size"] == len(expected)
        assert v["first_ok"] and v["op_ok"], v
        assert v["old_after"] == "CommAbortedError" and v["old_after_s"] < 1.0
    assert run["rc"] == 0, f"launcher exit {run['rc']}" + ctx
    assert run["leftover"] == [], f"processes left behind: {run['leftover']}"


@pytest.mark.parametrize("rep", range(REPEAT))
@pytest.mark.parametrize("world", [4, 5])
def test_a_survivor_killed_while_the_shrunk_engine_is_built(world: int, rep: int) -> None:
    """A second rank dies after the shrink agreed on it as a survivor, while the survivors'
    engine is being built: the others agree again without it and carry on."""
    with _load():
        run = run_chaos("KILL", "inside", "all_reduce", world, True, second_at="build")
    ctx = f"\n--- launcher log ---\n{run['log'][-12000:]}"
    res = run["results"]
    assert sorted(res) == run["survivors"], f"missing survivor results {sorted(res)}" + ctx
    for r, v in res.items():
        assert "shrink_error" not in v, f"rank {r}: {v['shrink_error']}" + ctx
        assert v["survivors"] == run["survivors"], f"rank {r} disagrees: {v['survivors']}" + ctx
        assert v["first_ok"] and v["op_ok"], f"rank {r}: {v}" + ctx
    assert run["rc"] == 0, f"launcher exit {run['rc']}" + ctx
    assert run["leftover"] == [], f"processes left behind: {run['leftover']}"


@pytest.mark.parametrize("rep", range(REPEAT))
@pytest.mark.parametrize("world", STEP_WORLDS)
def test_kill_at_a_random_instant_of_an_agreed_step(world: int, rep: int) -> None:
    victim = random.randrange(world)
    with _load():
        run = run_agreed_job(world, steps=5, victim=victim, kill_step=2)
    assert run["killed"] is not None, f"rank {victim} never died\n{run['log'][-3000:]}"
    check_agreed(run, world, victim, 5)


@pytest.mark.parametrize("rep", range(REPEAT))
@pytest.mark.parametrize("world", STEP_WORLDS[-1:])
def test_kill_while_a_healthy_rank_holds_the_gil(world: int, rep: int) -> None:
    """A rank is killed at a random instant of a step while another holds the GIL for 5 s in a
    C call from a random instant of the same step: the holder is slow, not hung (no false kill),
    and every survivor, the holder included, ends agreed."""
    rng = random.Random()
    victim = rng.randrange(world)
    holder = rng.choice([r for r in range(world) if r != victim])
    with _load():
        run = run_agreed_job(world, steps=5, victim=victim, kill_step=2, gil_rank=holder, gil_step=2)
    assert run["killed"] is not None, f"rank {victim} never died\n{run['log'][-3000:]}"
    assert run["held"] is not None and run["held"]["held_s"] >= 4.9, f"rank {holder} did not hold the GIL: {run['held']}"
    check_agreed(run, world, victim, 5)
