"""Three ranks all-reduce ones each step; rank 1 leaves at step 3 with exit code 0, without
finalizing its communicator: by ``os._exit(0)`` (``LEAVE_BY=os_exit``, the default: its heartbeat
still registered) or by a normal interpreter exit (``LEAVE_BY=sys_exit``: ``sys.exit(0)``, which
runs the ``atexit`` hooks). The survivors' all-reduce
fails; they agree the step failed, shrink and redo it, then print their world and the last sum.
Under ``torchcomms-run`` the agent sees rank 1's exit: the survivors' agreement must not wait
for a vote that can never come."""
import os
import sys

import torch

import torchcomms
from torchcomms import ReduceOp

comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="dp")
me = comm.get_rank()
step, total = 0, float("nan")
while step < 6:
    if me == 1 and step == 3:
        if os.environ.get("LEAVE_BY", "os_exit") == "sys_exit":
            sys.exit(0)
        os._exit(0)
    t = torch.ones(1)
    ok = True
    try:
        comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    except torchcomms.CommError as e:
        print(f"rank {me} step {step}: {type(e).__name__} failed_ranks={getattr(e, 'failed_ranks', None)}",
              flush=True)
        ok = False
    if not comm.agree(ok):
        comm = comm.shrink()
        continue
    total = t.item()
    step += 1
print(f"rank {me} done: world {comm.get_size()} last sum {total:g}", flush=True)
comm.finalize()
