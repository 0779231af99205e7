"""Multi-node smoke: the torchrun way (init_process_group("gloo") with MASTER_ADDR/PORT)
and the torchcomms way (new_comm through the agent's control plane) in one process."""
import os

import torch
import torch.distributed as dist

import torchcomms
from torchcomms import ReduceOp

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
expected = world * (world + 1) / 2

dist.init_process_group("gloo")
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == expected, (t.item(), expected)
dist.destroy_process_group()

comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="smoke")
assert (comm.get_rank(), comm.get_size()) == (rank, world)
u = torch.tensor([float(rank + 1)])
comm.all_reduce(u, ReduceOp.SUM, async_op=False)
assert u.item() == expected, (u.item(), expected)
comm.finalize()
print(f"both stacks ok rank={rank} local_rank={os.environ['LOCAL_RANK']} world={world} "
      f"sum={t.item():g}/{u.item():g}", flush=True)
