"""A communicator on every attempt. Attempt 0: the ranks agree on False and all-reduce, then
rank 1 exits 3. Later attempts: they agree on True and all-reduce; each rank prints what it
got. A restarted group must meet in a store as fresh as the first attempt's: keys left by the
previous attempt (the gloo rendezvous, agreement decisions) belong to processes that are gone."""
import os
import sys

import torch

import torchcomms
from torchcomms import ReduceOp

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="dp")
rank = comm.get_rank()
decided = comm.agree(attempt > 0)
t = torch.ones(1)
comm.all_reduce(t, ReduceOp.SUM, async_op=False)
print(f"rank {rank} attempt {attempt} agreed {decided} sum {t.item():g}", flush=True)
comm.finalize()
if attempt == 0 and rank == 1:
    sys.exit(3)
