"""Rank code for the engine-neutral refusal tests: arguments an engine cannot take are refused
on every rank before anything leaves the process, and the communicator goes on working."""
from __future__ import annotations

from typing import Any

import torch

import torchcomms
from tests.torchcomms.workers import engine
from torchcomms import ReduceOp


def _refused(call: Any) -> str:
    """The name of the error ``call()`` raised, with its message; ``"returned"`` if none."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the test compares the error's type
        return f"{type(e).__name__}: {e}"
    return "returned"


def complex_order_ops() -> dict[str, Any]:
    """MIN and MAX of complex tensors (complex numbers have no order) in every reducing
    collective (``order``); PRODUCT of complex tensors in each (``product``: it either multiplies,
    checked against torch's product here, or is refused); then an all_reduce SUM that must still
    work on the same communicator."""
    comm = torchcomms.new_comm(engine(), torch.device("cpu"), "complex-order")
    r, n = comm.get_rank(), comm.get_size()
    order: dict[str, str] = {}
    for dt in (torch.complex64, torch.complex128):
        for op in (ReduceOp.MIN, ReduceOp.MAX):
            x = torch.ones(4, dtype=dt)
            order[f"all_reduce {dt} {op}"] = _refused(lambda: comm.all_reduce(x, op, False))
            order[f"reduce {dt} {op}"] = _refused(lambda: comm.reduce(x, 0, op, False))
            order[f"reduce_scatter_single {dt} {op}"] = _refused(
                lambda: comm.reduce_scatter_single(torch.empty(4, dtype=dt), torch.ones(4 * n, dtype=dt), op, False))
    out: dict[str, Any] = {"order": order, "product": _complex_products(comm, r, n)}
    t = torch.ones(3, dtype=torch.complex64)
    comm.all_reduce(t, ReduceOp.SUM, False)
    out["sum_after"] = [t.real.tolist(), t.imag.tolist()]
    comm.finalize()
    return out


def _complex_products(comm: torchcomms.TorchComm, r: int, n: int) -> dict[str, str]:
    """Each reducing collective's PRODUCT of complex tensors: ``correct``, ``returned`` (not the
    root of a reduce), ``wrong: ...`` or the error it raised."""
    value = lambda q: torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * (q + 1)  # noqa: E731
    want = value(0)
    for q in range(1, n):
        want = want * value(q)
    calls = {
        "all_reduce": lambda x, out: comm.all_reduce(x, ReduceOp.PRODUCT, False),
        "reduce": lambda x, out: comm.reduce(x, 0, ReduceOp.PRODUCT, False),
        "reduce_scatter": lambda x, out: comm.reduce_scatter(out, [x] * n, ReduceOp.PRODUCT, False),
        "reduce_scatter_single": lambda x, out: comm.reduce_scatter_single(out, x.repeat(n), ReduceOp.PRODUCT, False),
    }
    got: dict[str, str] = {}
    for name, call in calls.items():
        x, res = value(r), torch.zeros(2, dtype=torch.complex64)
        outcome = _refused(lambda: call(x, res))
        if outcome == "returned" and (name != "reduce" or r == 0):
            result = x if name in ("all_reduce", "reduce") else res
            outcome = "correct" if torch.allclose(result, want) else f"wrong: {result.tolist()}"
        got[name] = outcome
    return got


def all_to_all_in_place() -> dict[str, Any]:
    """all_to_all_single and all_to_all_v_single whose output is their input (or overlaps it),
    at a size under and over the engines' eager limits; then a correct all_to_all_single on the
    same communicator."""
    comm = torchcomms.new_comm(engine(), torch.device("cpu"), "a2a-in-place")
    r, n = comm.get_rank(), comm.get_size()
    out: dict[str, Any] = {}
    for numel in (4, 1 << 16):
        t = torch.arange(n * numel, dtype=torch.float32) + 100 * r
        out[f"single same {numel}"] = _refused(lambda: comm.all_to_all_single(t, t, False))
        big = torch.zeros(n * numel + 1)
        out[f"single overlapping {numel}"] = _refused(
            lambda: comm.all_to_all_single(big[1:], big[:-1], False))
        rows = t.view(n * numel, 1)
        out[f"v same {numel}"] = _refused(lambda: comm.all_to_all_v_single(rows, rows, [numel] * n, [numel] * n, False))
    x = torch.arange(2 * n, dtype=torch.float32) + 100 * r
    y = torch.empty(2 * n)
    comm.all_to_all_single(y, x, False)
    out["after"] = y.tolist()
    comm.finalize()
    return out


def conjugate_views() -> dict[str, Any]:
    """Complex tensors that are conjugate views (``x.conj()``: a flag on the tensor, its memory
    holds the unconjugated values) given to collectives: refused; then a broadcast of a resolved one."""
    comm = torchcomms.new_comm(engine(), torch.device("cpu"), "conj-views")
    n = comm.get_size()
    x = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64)
    v = x.conj()
    out: dict[str, Any] = {
        "all_gather_single input": _refused(lambda: comm.all_gather_single(torch.empty(2 * n, dtype=x.dtype), v,
                                                                           False)),
        "all_gather_single output": _refused(lambda: comm.all_gather_single(torch.empty(2 * n, dtype=x.dtype).conj(),
                                                                            x, False)),
        "broadcast": _refused(lambda: comm.broadcast(x.clone().conj(), 0, False)),
        "all_reduce": _refused(lambda: comm.all_reduce(x.clone().conj(), ReduceOp.SUM, False)),
    }
    got = v.resolve_conj() if comm.get_rank() == 0 else torch.zeros(2, dtype=x.dtype)
    comm.broadcast(got, 0, False)  # (gloo's complex all-gathers fail inside c10d: 'Invalid scalar type')
    out["resolved"] = [[z.real, z.imag] for z in got.tolist()]
    comm.finalize()
    return out
