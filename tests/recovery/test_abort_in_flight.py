"""Aborting a communicator with an op in flight whose peer is alive: the op ends with
``CommAbortedError`` at once, and the engine's own error for it (the abort shut its connections
down) is dropped, not sent to the control plane to find which peer failed. Translating it held
the engine's callback thread for the attribution wait (``TORCHCOMM_FAILURE_ATTRIBUTION_S``, 1 s
by default), and ``abort()``, which waits until the engine has delivered its pending ops, with
it: an elastic job's survivor lost a second in a recovery."""
from __future__ import annotations

import json
import os

from tests.helpers.launcher_job import run_launcher_job
from tests.helpers.paths import REPO, child_pythonpath

JOB = REPO / "tests" / "recovery" / "abort_in_flight_job.py"


def test_abort_drops_the_engine_error_of_an_op_that_already_ended() -> None:
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), TORCHCOMM_TRACING_DISABLE="1")
    rc, log = run_launcher_job(["--nproc-per-node", "2", "--no-summary", str(JOB)], env, 120)
    assert rc == 0, log[-4000:]
    res = json.loads(next(line.split("RESULT ", 1)[1] for line in log.splitlines() if "RESULT " in line))
    assert res == {"error": "CommAbortedError", "attributions": 0}, log[-4000:]
