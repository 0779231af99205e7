"""Rank bodies on bare communicators (objcol, functional, integer AVG)."""
from __future__ import annotations

import os
from datetime import timedelta
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


class Opaque:
    """A type torch's weights-only unpickler does not allow."""

    def __init__(self, v: int) -> None:
        self.v = v


def objects() -> dict[str, Any]:
    from torchcomms import objcol

    c = _comm("objcol")
    r, n = c.get_rank(), c.get_size()
    out: dict[str, Any] = {}
    lst: list[Any] = [None] * n
    objcol.all_gather_object(c, lst, {"rank": r, "pad": "x" * (10 * r), "t": torch.full((2,), float(r))})
    out["all_gather"] = [[o["rank"], len(o["pad"]), o["t"].tolist()] for o in lst]
    g: list[Any] | None = [None] * n if r == 1 else None
    objcol.gather_object(c, ("g", r), 1, g)
    out["gather"] = [list(x) for x in g] if g is not None else None
    b: list[Any] = [f"root{n - 1}", {"k": [1, 2]}] if r == n - 1 else [None, None]
    objcol.broadcast_object_list(c, b, n - 1)
    out["broadcast"] = b
    s: list[Any] = [None]
    objcol.scatter_object_list(c, 0, s, [f"to{q}" * (q + 1) for q in range(n)] if r == 0 else None)
    out["scatter"] = s[0]
    if r in (0, 1):
        if r == 0:
            objcol.send_object_list(c, [1, "two", 3.0], 1)
        else:
            got: list[Any] = [None, None, None]
            objcol.recv_object_list(c, got, 0)
            out["p2p"] = got
    # an object of a type the weights-only unpickler does not allow is refused, not executed
    lst2: list[Any] = [None] * n
    try:
        objcol.all_gather_object(c, lst2, Opaque(r))
        out["opaque"] = "loaded"
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["opaque"] = type(e).__name__
    lst3: list[Any] = [None] * n
    objcol.all_gather_object(c, lst3, Opaque(r), weights_only=False)
    out["opaque_trusted"] = [o.v for o in lst3]
    # arguments one rank refuses (a list of the wrong length, an object that cannot be pickled)
    # are refused on every rank taking part, at once; the communicator goes on
    unpicklable = lambda: None  # noqa: E731
    to = timedelta(seconds=20)
    refusals = {
        "scatter root list": lambda: objcol.scatter_object_list(c, 0, [None], [1] if r == 0 else None, to),
        "gather root list": lambda: objcol.gather_object(c, r, 0, [None] if r == 0 else None, to),
        "all_gather object": lambda: objcol.all_gather_object(c, [None] * n, unpicklable if r == 1 else r, to),
        "broadcast object": lambda: objcol.broadcast_object_list(c, [unpicklable] if r == 0 else [None], 0, to),
    }
    if r in (0, 1):
        refusals["send object"] = lambda: (objcol.send_object_list(c, [unpicklable], 1, to) if r == 0
                                           else objcol.recv_object_list(c, [None], 0, to))
    out["refused"] = {}
    for case, call in refusals.items():
        try:
            call()
            out["refused"][case] = "returned"
        except torchcomms.CommError as e:
            out["refused"][case] = f"{type(e).__name__}: {e}"
    lst4: list[Any] = [None] * n
    objcol.all_gather_object(c, lst4, r)
    out["after_refusals"] = lst4
    c.finalize()
    return out


def functional_compiled() -> dict[str, Any]:
    import torchcomms.functional as F

    c = _comm("functional")
    r, n = c.get_rank(), c.get_size()
    F.register_comm(c)

    def step(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = F.all_reduce(x * 2, ReduceOp.SUM, c)
        g = F.all_gather_single(x + 1, c)
        s = F.reduce_scatter_single(g, ReduceOp.SUM, c)
        t = F.all_to_all_single(g, c)
        return a, g, s, t

    x = torch.arange(n, dtype=torch.float32) + 10 * r
    eager = step(x)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(x)
    # autograd: d/dx sum(all_reduce(x)) = n on every element
    y = x.clone().requires_grad_(True)
    F.all_reduce(y, ReduceOp.SUM, c).sum().backward()
    z = x.clone().requires_grad_(True)
    F.all_gather_single(z, c).pow(2).sum().backward()
    w = F.all_reduce(x, "sum", c, async_op=True)
    c.finalize()
    return {"eager": [t.tolist() for t in eager], "compiled": [t.tolist() for t in compiled],
            "grad_all_reduce": y.grad.tolist(), "grad_all_gather": z.grad.tolist(),
            "async_type": type(w).__name__, "async_wait": w.wait().tolist(),
            "compile_supported": F.is_torch_compile_supported()}


def device_mesh_2d() -> dict[str, Any]:
    """torchcomms.device_mesh over dp x tp communicators split from a world communicator,
    without init_process_group; a DTensor reduction runs on them."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from torchcomms.device_mesh import init_device_mesh
    from torchcomms.hooks import FlightRecorderHook

    world = _comm("mesh-world")
    rec = FlightRecorderHook(max_entries=10000)
    rec.register_with_comm(world)
    r = world.get_rank()
    dp_ranks = [q for q in range(4) if q % 2 == r % 2]
    tp_ranks = [q for q in range(4) if q // 2 == r // 2]
    dp = world.split(dp_ranks, "mesh-dp")
    tp = world.split(tp_ranks, "mesh-tp")
    mesh = init_device_mesh((dp, tp), ("dp", "tp"), _global_comm=world)
    local = torch.full((2, 3), float(r))
    dt = DTensor.from_local(local, mesh, [Shard(0), Shard(1)])
    total = dt.full_tensor()
    s = dt.sum().full_tensor()
    rep = DTensor.from_local(torch.full((2,), float(r)), mesh, [Replicate(), Replicate()])
    import json

    ops = sorted({e["profiling_name"] for e in json.loads(rec.dump_json())["entries"]})
    out = {"mesh": mesh.mesh.tolist(), "names": list(mesh.mesh_dim_names), "total": total.tolist(),
           "sum": float(s), "dp_ranks": dist.get_process_group_ranks(mesh.get_group("dp")),
           "tp_ranks": dist.get_process_group_ranks(mesh.get_group("tp")),
           "backend": dist.get_backend(mesh.get_group("tp")), "ops": ops,
           "rep": rep.to_local().tolist()}
    return out
