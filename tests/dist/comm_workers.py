"""Rank bodies on bare communicators (objcol, functional, integer AVG)."""
from __future__ import annotations

import os
from typing import Any

import torch

import torchcomms
from torchcomms import ReduceOp


def _comm(name: str) -> Any:
    return torchcomms.new_comm("gloo", torch.device("cpu"), name)


def integer_avg() -> dict[str, Any]:
    c = _comm("int-avg")
    r, n = c.get_rank(), c.get_size()
    a = r + 1 + (r == 0)  # 2, 2, 3: sum 7, so the mean 7/3 must truncate (and -7/3 toward zero)
    t = torch.tensor([a, -a, 7], dtype=torch.int64)
    c.all_reduce(t, ReduceOp.AVG, False)
    inp = torch.tensor([3 * r + 15 + p + (r == 0) for p in range(n)], dtype=torch.int32)  # sums 55 + 3p
    out = torch.empty(1, dtype=torch.int32)
    c.reduce_scatter_single(out, inp, ReduceOp.AVG, False)
    c.finalize()
    return {"all_reduce": t.tolist(), "reduce_scatter": out.tolist()}
