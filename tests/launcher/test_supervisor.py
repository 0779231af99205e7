"""WorkerGroup with real worker processes: stopping them is bounded whatever they do."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

from launcher.env import WorkerPlacement
from launcher.supervisor import WorkerGroup, WorkerSpec

from conftest import base_env, worker


def _spec(rank: int, script: str, **env: str) -> WorkerSpec:
    placement = WorkerPlacement(rank=rank, local_rank=rank, world_size=1, local_world_size=1, node_rank=0,
                                num_nodes=1)
    return WorkerSpec(placement=placement, argv=[sys.executable, worker(script)],
                      env=base_env(RANK=str(rank), **env), host="localhost")


def test_stop_kills_a_worker_that_left_its_process_group(tmp_path) -> None:
    """A worker that moved into another process group (and ignores SIGTERM) is out of reach of
    the group signals: stop() must still kill it and return (it used to wait for it forever)."""
    group = WorkerGroup()
    group.start([_spec(0, "leaves_group.py", PID_DIR=str(tmp_path), JOIN_PGID=str(os.getpgrp()), SLEEP="60")])
    deadline = time.monotonic() + 20
    while not (tmp_path / "pid").exists():
        assert time.monotonic() < deadline, "the worker never got ready"
        time.sleep(0.02)
    pid = int((tmp_path / "pid").read_text())
    assert os.getpgid(pid) == os.getpgrp()  # it really left the group made for it
    stopper = threading.Thread(target=group.stop, args=(0.5,), kwargs={"dump": None}, daemon=True)
    stopper.start()
    stopper.join(10)
    hung = stopper.is_alive()
    if hung:
        os.kill(pid, signal.SIGKILL)  # let the stuck stop() end
        stopper.join(10)
    assert not hung, "stop() waited forever for a worker outside its process group"
    assert not group.alive() and group.workers[0].result.signal == signal.SIGKILL
