"""A process leaving through the interpreter's normal exit right after nccl ops on tensors it
dropped, without finalizing: c10d's threads letting go of those ops must not need a finalizing
interpreter (which ends such a thread with ``pthread_exit``, aborting the process from inside
a C++ destructor: "terminate called without an active exception")."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.cpu_load import oversubscribed
from tests.helpers.paths import REPO, child_pythonpath
from tests.nccl.conftest import needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]

_CHILD = """
import torch, torchcomms
from torchcomms import ReduceOp
comm = torchcomms.new_comm("nccl", torch.device("cuda", 0), "leaving", hints={"rank": "0", "size": "1"})
for i in range(4):
    comm.all_reduce(torch.full((1 << 16,), float(i), device="cuda"), ReduceOp.SUM, True).wait()
    comm.all_reduce(torch.full((1 << 16,), float(i), device="cuda"), ReduceOp.SUM, False)
torch.cuda.synchronize()
"""


def test_normal_exit_right_after_ops_on_dropped_tensors() -> None:
    env = dict(os.environ, PYTHONPATH=child_pythonpath())
    with oversubscribed(per_core=4, limit_s=300):
        _leave_ten_times(env)


def _leave_ten_times(env: dict[str, str]) -> None:
    for _ in range(10):
        proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "terminate called" not in proc.stderr
