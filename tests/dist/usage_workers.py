"""Rank bodies: what users do through ``torch.distributed`` besides training loops (tensor
layouts), route on or off."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _flat(t: torch.Tensor) -> list[float]:
    return t.detach().flatten().tolist()


def dense_layouts() -> dict[str, Any]:
    """Element-wise ops on dense tensors that are not contiguous: channels_last, a transpose."""
    dist.init_process_group("gloo")
    r = dist.get_rank()
    nchw = (torch.arange(24, dtype=torch.float32).reshape(2, 3, 2, 2) + r).to(memory_format=torch.channels_last)
    dist.all_reduce(nchw)
    tr = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * (r + 1)).t()
    dist.broadcast(tr, src=1)
    red = (torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * r).t()
    dist.reduce(red, dst=0, op=dist.ReduceOp.MAX)
    out = {"all_reduce": _flat(nchw), "broadcast": _flat(tr), "reduce": _flat(red) if r == 0 else None,
           "strides": list(nchw.stride())}
    dist.destroy_process_group()
    return out
