"""Rank bodies: all_reduce of sparse COO tensors through ``torch.distributed`` (route on or
off), and DDP over an ``nn.Embedding(sparse=True)``."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def _sparse(rank: int) -> torch.Tensor:
    """Rank 0 holds nothing; rank r > 0 holds rows 0 and r of a (4, 3) hybrid tensor (1 sparse
    dim, 1 dense dim), row 0 twice (uncoalesced)."""
    if rank == 0:
        return torch.sparse_coo_tensor(torch.empty(1, 0, dtype=torch.int64), torch.empty(0, 3), (4, 3))
    idx = torch.tensor([[0, rank, 0]])
    vals = torch.arange(9, dtype=torch.float32).reshape(3, 3) + rank
    return torch.sparse_coo_tensor(idx, vals, (4, 3))


def sparse_all_reduce() -> dict[str, Any]:
    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    t = _sparse(r)
    dist.all_reduce(t)
    want = sum(_sparse(q).to_dense() for q in range(n))
    torch.manual_seed(0)
    model = DDP(nn.Embedding(10, 3, sparse=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(3):
        loss = model(torch.tensor([r, 5 + step, 9])).pow(2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    out = {"got": t.to_dense().tolist(), "want": want.tolist(), "losses": losses,
           "weight": model.module.weight.detach().tolist()}
    try:
        dist.all_reduce(_sparse(r), op=dist.ReduceOp.MAX)
        out["max"] = "no error"
    except (ValueError, RuntimeError) as e:
        out["max"] = type(e).__name__
    dist.destroy_process_group()
    return out
