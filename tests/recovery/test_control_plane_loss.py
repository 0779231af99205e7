"""Loss of the control-plane host is the job's single point of failure: ranks raise a clear
error and exit; nothing hangs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers.ranks import REPO, RankGroup


def test_ranks_raise_clearly_when_the_control_plane_dies() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tc-cp-"))
    secret = tmp / "secret"
    server = subprocess.Popen([sys.executable, "-m", "torchcomms.control", "--new-secret-file", str(secret)],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        addr = server.stdout.readline().decode().strip()
        assert addr.startswith("tcp://"), addr
        env = {"TORCHCOMM_CONTROL_ADDR": addr, "TORCHCOMM_CONTROL_SECRET_FILE": str(secret),
               "TC_READY_DIR": str(tmp), "TORCHCOMM_TRACING_DISABLE": "1"}
        with RankGroup(2, "tests.recovery.workers:until_control_plane_lost", env=env) as g:
            deadline = time.monotonic() + 120
            while len(list(tmp.glob("ready*"))) < 2:
                assert time.monotonic() < deadline, "ranks never got ready"
                assert all(p.poll() is None for p in g.procs), "a rank died early"
                time.sleep(0.05)
            time.sleep(0.3)
            t_kill = time.time()
            server.kill()
            results = g.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    for res in results:
        assert res.value is not None, res.stderr[-2000:]
        assert res.value["raised"] == "CommAbortedError", res.value
        assert "control plane" in res.value["message"] and "single point of failure" in res.value["message"]
        assert res.value["t"] - t_kill < 30  # generous: what matters is that nothing hangs
