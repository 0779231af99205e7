"""A script written for torchrun: reads RANK/LOCAL_RANK/WORLD_SIZE, gloo all_reduce."""
import os

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
assert dist.get_rank() == rank and dist.get_world_size() == world
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
expected = world * (world + 1) / 2
assert t.item() == expected, (t.item(), expected)
print(f"all_reduce ok rank={rank} local_rank={local_rank} world={world} sum={t.item():g}",
      flush=True)
dist.destroy_process_group()
