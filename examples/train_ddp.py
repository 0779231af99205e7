"""Data-parallel training of a small MLP over a torchcomms communicator (CPU, gloo).

Run with the launcher (it sets rank, size and the control-plane address):

    torchcomms-run --nproc-per-node 2 examples/train_ddp.py --steps 40

Each rank trains on its own shard of a synthetic regression problem; gradients are averaged
with one synchronous all_reduce per step of all of them flattened into one buffer (for
collectives overlapped with compute, see examples/train_fsdp.py). Rank 0 prints the global
loss, which decreases.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn

import torchcomms
from torchcomms import ReduceOp


def make_data(rank: int, size: int, n: int = 4096, dim: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    w_true = torch.randn(dim, 1, generator=g)
    x = torch.randn(n, dim, generator=g)
    y = torch.tanh(x @ w_true / dim**0.5) + 0.05 * torch.randn(n, 1, generator=g)
    shard = slice(rank * n // size, (rank + 1) * n // size)
    return x[shard], y[shard]


def average_gradients(comm: torchcomms.TorchComm, model: nn.Module) -> None:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    comm.all_reduce(flat, ReduceOp.AVG, async_op=False)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    torch.set_num_threads(1)

    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="dp")
    rank, size = comm.get_rank(), comm.get_size()
    torch.manual_seed(1234)  # identical initial weights on every rank
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    x, y = make_data(rank, size)
    gen = torch.Generator().manual_seed(rank)
    t0 = time.perf_counter()
    first = last = None
    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (args.batch,), generator=gen)
        loss = nn.functional.mse_loss(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        average_gradients(comm, model)
        opt.step()
        global_loss = loss.detach().reshape(1)
        comm.all_reduce(global_loss, ReduceOp.AVG, async_op=False)
        first = global_loss.item() if first is None else first
        last = global_loss.item()
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {last:.4f}  (world {size})", flush=True)
    if rank == 0:
        print(f"loss {first:.4f} -> {last:.4f} in {args.steps} steps, {time.perf_counter() - t0:.2f} s", flush=True)
    comm.finalize()


if __name__ == "__main__":
    main()
