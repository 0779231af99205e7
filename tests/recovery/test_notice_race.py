"""A failure notice that lands while an op is being dispatched (after the communicator's
usability check, before the op is tracked in flight) still ends that op at once.

Before the fix the break failed only the ops already tracked, so this op went on to wait in
the engine for a dead (or absent) peer until its full timeout, while the other survivors had
raised within milliseconds. The notice is delivered deterministically: a pre-hook (which runs
in exactly that window) holds the op until the SIGKILL of a real gloo peer has broken the
communicator through the launcher's control plane.
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

import pytest

from tests.helpers.paths import child_pythonpath
from tests.helpers.ranks import REPO

WORKER = REPO / "tests" / "recovery" / "notice_race_worker.py"
OP_TIMEOUT_S = 30
RAISE_BOUND_S = 5.0  # far below the op's timeout; the real latency is milliseconds


@pytest.mark.parametrize("op", ["recv", "all_reduce"])
def test_notice_during_dispatch_fails_the_op_at_once(op: str) -> None:
    out = Path(tempfile.mkdtemp(prefix="tc-race-"))
    cfg = {"op": op, "dir": str(out), "timeout_s": OP_TIMEOUT_S}
    env = dict(os.environ, TC_RACE_CFG=json.dumps(cfg), TORCHCOMM_TRACING_DISABLE="1",
               PYTHONPATH=child_pythonpath())
    cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", "3", "--on-failure", "shrink",
           "--no-summary", str(WORKER)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        rc = proc.wait(150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    res_path = out / "result0.json"
    assert res_path.exists(), f"rank 0 wrote no result\n{log[-4000:]}"
    res = json.loads(res_path.read_text())
    assert res["broken_in_hook"], res  # the notice did land inside the dispatch window
    assert res["raised"] == "PeerFailureError", f"{res}\n{log[-3000:]}"
    assert res["failed_ranks"] == [2], res
    assert res["after_broken_s"] < RAISE_BOUND_S, res
    assert rc == 0, f"launcher exit {rc}\n{log[-4000:]}"
    time.sleep(0.1)
