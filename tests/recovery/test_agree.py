"""``comm.agree``: survivors take the same branch after a step whose collective completed on
some members and failed on others, so parameters stay bitwise identical and step counters equal.

With the pattern without agreement (``except CommError: comm = comm.shrink()`` and redo) the
member whose op failed redoes the step while the others apply it: its parameters differ and it
waits in a shrink the others never join.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import child_pythonpath
from tests.helpers.ranks import REPO

WORKER = REPO / "tests" / "recovery" / "agreed_step_worker.py"


def run_agreed_job(world: int, steps: int = 6, victim: int = -1, kill_step: int = -1, fail_rank: int = -1,
                   fail_step: int = -1, timeout_s: int = 60, limit_s: float = 240) -> dict[str, Any]:
    """Run the agreed-step job; returns the launcher's exit code and log, each survivor's result,
    the victim's kill record and the pids left alive."""
    out = Path(tempfile.mkdtemp(prefix="tc-agree-"))
    cfg = {"steps": steps, "dir": str(out), "timeout_s": timeout_s, "victim": victim, "kill_step": kill_step,
           "fail_rank": fail_rank, "fail_step": fail_step}
    env = dict(os.environ, TC_STEP_CFG=json.dumps(cfg), TORCHCOMM_TRACING_DISABLE="1", PYTHONPATH=child_pythonpath())
    cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", str(world), "--on-failure", "shrink",
           "--no-summary", str(WORKER)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        rc = proc.wait(limit_s)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    results = {r: json.loads((out / f"result{r}.json").read_text()) for r in range(world)
               if (out / f"result{r}.json").exists()}
    killed = json.loads((out / "killed.json").read_text()) if (out / "killed.json").exists() else None
    pids = [json.loads((out / f"pid{r}.json").read_text())["pid"] for r in range(world)
            if (out / f"pid{r}.json").exists()]
    time.sleep(0.2)
    leftover = [p for p in pids if _alive(p)]
    return {"rc": rc, "log": log, "results": results, "killed": killed, "leftover": leftover,
            "wall_s": time.monotonic() - t0}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def check_agreed(run: dict[str, Any], world: int, victim: int, steps: int) -> None:
    """Every survivor finished the same steps with the same parameters and members."""
    ctx = f"\n--- launcher log ---\n{run['log'][-4000:]}"
    res = run["results"]
    survivors = [r for r in range(world) if r != victim or run["killed"] is None]
    assert sorted(res) == survivors, f"results from {sorted(res)}, expected {survivors}" + ctx
    first = res[survivors[0]]
    for r in survivors:
        v = res[r]
        assert v["step"] == steps, f"rank {r}: {v}" + ctx
        assert v["params_sha"] == first["params_sha"], f"ranks {survivors[0]} and {r} diverged" + ctx
        assert v["decisions"] == first["decisions"], f"ranks took different branches: {v} vs {first}" + ctx
        assert v["members"] == first["members"] == survivors, f"rank {r}: members {v['members']}" + ctx
    assert run["rc"] == 0, f"launcher exit {run['rc']}" + ctx
    assert run["leftover"] == [], f"processes left behind: {run['leftover']}"


def test_a_step_failed_on_one_member_is_redone_by_all() -> None:
    run = run_agreed_job(3, steps=5, fail_rank=1, fail_step=2)
    check_agreed(run, 3, -1, 5)
    decisions = run["results"][0]["decisions"]
    assert decisions == [True, True, False, True, True, True], decisions  # step 2 redone once, by all
    assert all(v["shrinks"] == 1 for v in run["results"].values())


@pytest.mark.parametrize("world", [3, 4])
def test_a_kill_inside_a_step_leaves_survivors_identical(world: int) -> None:
    run = run_agreed_job(world, steps=6, victim=world - 1, kill_step=3)
    assert run["killed"] is not None, run["log"][-3000:]
    check_agreed(run, world, world - 1, 6)
