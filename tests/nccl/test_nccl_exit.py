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


#: processes that leave, and how many at once (one at a time, ten under the load outlived the
#: test's 300 s limit on the loaded GPU host)
LEAVERS, AT_ONCE = 10, 5


def test_normal_exit_right_after_ops_on_dropped_tensors() -> None:
    env = dict(os.environ, PYTHONPATH=child_pythonpath())
    with oversubscribed(per_core=4, limit_s=300, cpus=2):
        for _ in range(LEAVERS // AT_ONCE):
            procs = [subprocess.Popen([sys.executable, "-c", _CHILD], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True) for _ in range(AT_ONCE)]
            try:
                errs = [p.communicate(timeout=120)[1] for p in procs]
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
            for p, err in zip(procs, errs):
                assert p.returncode == 0, err[-3000:]
                assert "terminate called" not in err
