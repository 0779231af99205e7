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


def on_parameters() -> dict[str, Any]:
    """AVG, PREMUL_SUM and list outputs on tensors that require grad (``nn.Parameter``s, outside
    ``torch.no_grad()``), as a user averaging parameters does, and on tensors made under
    ``torch.inference_mode()``: the engines' local steps (the scaling, the division, the copy into
    list outputs) must not trip torch's in-place checks.
    Returns each op's values (or error) and whether the communicator still works."""
    comm = torchcomms.new_comm(engine(), torch.device("cpu"), "params")
    r, n = comm.get_rank(), comm.get_size()
    out: dict[str, Any] = {}

    def param(value: float, numel: int = 4) -> torch.nn.Parameter:
        return torch.nn.Parameter(torch.full((numel,), value))

    def run(name: str, call: Any) -> None:
        try:
            out[name] = call()
        except Exception as e:  # noqa: BLE001 - the test reads the error
            out[name] = f"{type(e).__name__}: {e}"

    def all_reduce(op: ReduceOp) -> list[float]:
        p = param(float(r + 1))
        comm.all_reduce(p, op, False)
        return p.tolist()

    def reduce_avg() -> list[float] | None:
        p = param(float(r + 1))
        comm.reduce(p, 0, ReduceOp.AVG, False)
        return p.tolist() if r == 0 else None

    def all_gather() -> list[list[float]]:
        outs = [param(0.0) for _ in range(n)]
        comm.all_gather(outs, torch.full((4,), float(r + 1)), False)
        return [o.tolist() for o in outs]

    def reduce_scatter_avg() -> list[float]:
        p = param(0.0)
        comm.reduce_scatter(p, [torch.full((4,), float(r + 1)) for _ in range(n)], ReduceOp.AVG, False)
        return p.tolist()

    run("all_reduce AVG", lambda: all_reduce(ReduceOp.AVG))

    def inference_avg(op: ReduceOp) -> list[float]:
        with torch.inference_mode():  # e.g. a metric computed in evaluation, averaged outside it
            t = torch.full((4,), float(r + 1))
        comm.all_reduce(t, op, False)
        return t.tolist()

    run("inference AVG", lambda: inference_avg(ReduceOp.AVG))
    run("inference PREMUL_SUM", lambda: inference_avg(ReduceOp.PREMUL_SUM(0.5)))
    run("all_reduce PREMUL_SUM", lambda: all_reduce(ReduceOp.PREMUL_SUM(0.5)))
    run("reduce AVG", reduce_avg)
    if engine() == "mpi":  # gloo's are c10d's, whose own copies into the outputs raise (a BackendError)
        run("all_gather", all_gather)
        run("reduce_scatter AVG", reduce_scatter_avg)
    t = torch.ones(2)
    comm.all_reduce(t, ReduceOp.SUM, False)
    out["sum_after"] = t.tolist()
    comm.finalize()
    return out
