"""A torchrun-style smoke test: every rank all-reduces its rank + 1 and checks the sum.

Runs unchanged under torchrun and torchcomms-run (gloo on CPU, NCCL when CUDA is visible).
"""

import os
import socket

import torch
import torch.distributed as dist

from launcher import record


@record
def main() -> None:
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)], device="cuda" if use_cuda else "cpu")
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    if t.item() != expected:
        raise RuntimeError(f"all_reduce gave {t.item()}, expected {expected}")
    print(f"rank {rank}/{world} on {socket.gethostname()}: all_reduce ok ({t.item():g})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
