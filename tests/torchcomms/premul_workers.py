"""Rank code for the PREMUL_SUM tests: factors of every form a user passes, on every reducing
collective, against a float64 reference."""
from __future__ import annotations

from typing import Any

import torch

import torchcomms
from tests.torchcomms.workers import engine
from torchcomms import ReduceOp

#: the factors: a Python float, a 0-dim float64 tensor, and a one-element float32 tensor (which
#: promotes a half tensor to float32 in ``t * factor``; c10d's PREMUL_SUM takes each)
FACTORS = {"float": lambda: 0.5, "0-dim f64": lambda: torch.tensor(0.5, dtype=torch.float64),
           "1-elem f32": lambda: torch.tensor([0.5])}


def premul_sum(dtypes: list[str]) -> dict[str, Any]:
    """Each reducing collective with PREMUL_SUM(factor) over tensors of ``dtypes``; returns the
    cases whose result (on the ranks that get one) is wrong or whose dtype changed, and how many ran."""
    comm = torchcomms.new_comm(engine(), torch.device("cpu"), "premul")
    r, n = comm.get_rank(), comm.get_size()
    wrong: list[str] = []
    checks = 0

    def data(q: int, k: int, numel: int, dt: torch.dtype) -> torch.Tensor:
        return ((torch.arange(numel) * (q + 2) + q + k) % 3 + 1).to(dt)

    def check(label: str, got: torch.Tensor, xs: list[torch.Tensor]) -> None:
        nonlocal checks
        checks += 1
        want = sum(x.double() * 0.5 for x in xs)
        if got.dtype != xs[0].dtype or not torch.allclose(got.double(), want, rtol=1e-2, atol=1e-2):
            wrong.append(f"{label}: got {got.tolist()} ({got.dtype}) want {want.tolist()}")

    for dname in dtypes:
        dt = getattr(torch, dname)
        for fname, factor in FACTORS.items():
            op = ReduceOp.PREMUL_SUM(factor())
            lab = f"{dname} {fname}"
            xs = [data(q, 0, 4, dt) for q in range(n)]
            t = xs[r].clone()
            comm.all_reduce(t, op, False)
            check(f"all_reduce {lab}", t, xs)
            for root in range(n):
                t = xs[r].clone()
                comm.reduce(t, root, op, False)
                if r == root:
                    check(f"reduce root={root} {lab}", t, xs)
            ins = [[data(q, k + 1, 4, dt) for k in range(n)] for q in range(n)]
            out = torch.empty(4, dtype=dt)
            comm.reduce_scatter_single(out, torch.cat(ins[r]), op, False)
            check(f"reduce_scatter_single {lab}", out, [ins[q][r] for q in range(n)])
            out = torch.empty(4, dtype=dt)
            comm.reduce_scatter(out, ins[r], op, False)
            check(f"reduce_scatter {lab}", out, [ins[q][r] for q in range(n)])
            vins = [[data(q, k + 5, k + 2, dt) for k in range(n)] for q in range(n)]
            out = torch.empty(r + 2, dtype=dt)
            comm.reduce_scatter_v(out, vins[r], op, False)
            check(f"reduce_scatter_v {lab}", out, [vins[q][r] for q in range(n)])
    comm.finalize()
    return {"wrong": wrong, "checks": checks}
