"""Run the agreed-step job (``agreed_step_worker.py``) under the launcher and check its survivors."""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.helpers.launcher_job import run_launcher_job
from tests.helpers.paths import child_pythonpath
from tests.helpers.ranks import REPO

WORKER = REPO / "tests" / "recovery" / "agreed_step_worker.py"


def run_agreed_job(world: int, steps: int = 6, victim: int = -1, kill_step: int = -1, fail_rank: int = -1,
                   fail_step: int = -1, timeout_s: int = 60, limit_s: float = 240, gil_rank: int = -1,
                   gil_step: int = -1) -> dict[str, Any]:
    """Run the agreed-step job; returns the launcher's exit code and log, each survivor's result,
    the victim's kill record, the GIL holder's record and the pids left alive."""
    out = Path(tempfile.mkdtemp(prefix="tc-agree-"))
    cfg = {"steps": steps, "dir": str(out), "timeout_s": timeout_s, "victim": victim, "kill_step": kill_step,
           "fail_rank": fail_rank, "fail_step": fail_step, "gil_rank": gil_rank, "gil_step": gil_step}
    env = dict(os.environ, TC_STEP_CFG=json.dumps(cfg), TORCHCOMM_TRACING_DISABLE="1", PYTHONPATH=child_pythonpath())
    t0 = time.monotonic()
    rc, log = run_launcher_job(["--nproc-per-node", str(world), "--on-failure", "shrink", "--no-summary",
                                str(WORKER)], env, limit_s)
    results = {r: json.loads((out / f"result{r}.json").read_text()) for r in range(world)
               if (out / f"result{r}.json").exists()}
    killed = json.loads((out / "killed.json").read_text()) if (out / "killed.json").exists() else None
    held = json.loads((out / "held.json").read_text()) if (out / "held.json").exists() else None
    pids = [json.loads((out / f"pid{r}.json").read_text())["pid"] for r in range(world)
            if (out / f"pid{r}.json").exists()]
    time.sleep(0.2)
    leftover = [p for p in pids if _alive(p)]
    return {"rc": rc, "log": log, "results": results, "killed": killed, "held": held, "leftover": leftover,
            "wall_s": time.monotonic() - t0}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


#: how long after the kill every survivor must have finished (the ops' timeout is longer, so a
#: survivor left waiting on a dead peer until its timeout fails this)
RECOVERY_BOUND_S = 40.0


def check_agreed(run: dict[str, Any], world: int, victim: int, steps: int) -> None:
    """Every survivor finished the same steps with the same parameters and members, within
    ``RECOVERY_BOUND_S`` of the kill; the job exited 0 and left no process behind."""
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
        if run["killed"] is not None:
            late = v["t_end"] - run["killed"]["t"]
            assert late <= RECOVERY_BOUND_S, f"rank {r} finished {late:.1f} s after the kill" + ctx
    assert run["rc"] == 0, f"launcher exit {run['rc']}" + ctx
    assert run["leftover"] == [], f"processes left behind: {run['leftover']}"
