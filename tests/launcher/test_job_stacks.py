"""A launcher job that a test kills at its limit reports every process's stacks
(``tests/helpers/launcher_job.py``): a hung job's failure then says where it waited."""
from __future__ import annotations

import os
import time
from pathlib import Path

from tests.helpers.launcher_job import STACKS_MARK, descendants, run_launcher_job
from tests.helpers.paths import child_pythonpath

WORKER = Path(__file__).resolve().parent / "workers" / "waits_forever.py"
LIMIT_S = 8.0  # the launcher and its worker start well within it, even on a loaded machine


def test_a_job_killed_at_its_limit_reports_where_each_process_waited() -> None:
    env = dict(os.environ, PYTHONPATH=child_pythonpath())
    t0 = time.monotonic()
    rc, log = run_launcher_job(["--nproc-per-node", "1", "--no-summary", str(WORKER)], env, LIMIT_S)
    assert rc is None
    assert time.monotonic() - t0 < LIMIT_S + 30, "killing the job took too long"
    assert "worker waiting" in log, log
    _, mark, stacks = log.partition(STACKS_MARK)
    assert mark, log
    assert "wait_for_a_message_that_never_comes" in stacks, stacks  # the worker's main thread
    assert "launcher" in stacks, stacks  # the launcher's own threads
    assert stacks.count(STACKS_MARK) >= 1, stacks  # a second section: the launcher's and its worker's
    assert not [p for p in descendants(os.getpid()) if Path(f"/proc/{p}/cmdline").exists()
                and b"waits_forever" in Path(f"/proc/{p}/cmdline").read_bytes()], "the worker outlived the kill"
