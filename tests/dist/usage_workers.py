"""Rank bodies: what users do through ``torch.distributed`` besides training loops (tensor
layouts, DeviceMesh and DTensor redistribution, functional collectives, DCP), route on or off."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn


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


def mesh_and_dtensor() -> dict[str, Any]:
    """A 2 x 2 DeviceMesh: sub-mesh groups, ``_flatten``, local ranks, and DTensor redistributions
    (Shard, Replicate, Partial) on a 1-D and on the 2-D mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    dist.init_process_group("gloo")
    r = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = torch.tensor([float(r)]), torch.tensor([float(r)])
    dist.all_reduce(dp, group=mesh["dp"].get_group())
    dist.all_reduce(tp, group=mesh.get_group("tp"))
    flat = mesh._flatten("dp_tp")
    everyone = torch.tensor([float(r)])
    dist.all_reduce(everyone, group=flat.get_group())
    line = init_device_mesh("cpu", (4,))
    full = torch.arange(16, dtype=torch.float32).reshape(8, 2)
    d = distribute_tensor(full, line, [Shard(0)])
    rep = d.redistribute(line, [Replicate()])
    col = rep.redistribute(line, [Shard(1)])
    part = DTensor.from_local(torch.arange(8, dtype=torch.float32) * (r + 1), line, [Partial()])
    grid = distribute_tensor(torch.arange(32, dtype=torch.float32).reshape(8, 4), mesh, [Shard(0), Shard(1)])
    moved = grid.redistribute(mesh, [Replicate(), Shard(0)]).redistribute(mesh, [Shard(1), Replicate()])
    summed = DTensor.from_local(torch.full((2, 2), float(r + 1)), mesh, [Partial(), Partial()])
    out = {
        "local": [mesh.get_local_rank("dp"), mesh.get_local_rank("tp"), flat.get_local_rank()],
        "groups": [dist.get_process_group_ranks(mesh["dp"].get_group()),
                   dist.get_process_group_ranks(flat.get_group())],
        "sums": [dp.item(), tp.item(), everyone.item()],
        "line": [_flat(rep.to_local()), _flat(col.to_local()), _flat(part.redistribute(line, [Shard(0)]).to_local()),
                 _flat(part.redistribute(line, [Replicate()]).to_local())],
        "grid": [_flat(grid.to_local()), _flat(moved.to_local()), _flat(moved.full_tensor()),
                 _flat(summed.redistribute(mesh, [Replicate(), Shard(1)]).to_local())],
    }
    dist.destroy_process_group()
    return out


def functional_collectives() -> dict[str, Any]:
    """torch's functional collectives and their ``wait_tensor``, on a group and on a mesh."""
    import torch.distributed._functional_collectives as fc
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    g = dist.group.WORLD
    x = torch.arange(4, dtype=torch.float32) + r
    pending = [fc.all_reduce(x, "sum", g), fc.all_gather_tensor(x, 0, g),
               fc.reduce_scatter_tensor(torch.arange(4 * n, dtype=torch.float32) * (r + 1), "sum", 0, g),
               fc.all_reduce(x, "avg", g), fc.all_to_all_single(torch.arange(n, dtype=torch.float32) + 10 * r,
                                                                None, None, g),
               fc.all_reduce(x, "max", (init_device_mesh("cpu", (n,)), 0))]
    out = {"values": [_flat(fc.wait_tensor(t)) for t in pending]}
    dist.destroy_process_group()
    return out


def dcp_round_trip(path: str) -> dict[str, Any]:
    """FSDP2 (torch's ``fully_shard``) trained two steps, saved with DCP from ``get_state_dict``,
    loaded into a fresh model and optimizer with ``set_state_dict``; one more step on both."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    r = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))

    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.Adam(model.parameters(), lr=0.01)

    def step(model: nn.Module, opt: torch.optim.Optimizer, k: int) -> None:
        g = torch.Generator().manual_seed(100 * k + r)
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.randn(4, 8, generator=g)), torch.randn(4, 2, generator=g)).backward()
        opt.step()

    model, opt = build()
    for k in range(2):
        step(model, opt, k)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    saved = [_flat(p.full_tensor()) for p in model.parameters()]
    model2, opt2 = build()
    msd2, osd2 = get_state_dict(model2, opt2)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    loaded = [_flat(p.full_tensor()) for p in model2.parameters()]
    step(model, opt, 9)
    step(model2, opt2, 9)
    out = {"saved": saved, "loaded": loaded, "next": [_flat(p.full_tensor()) for p in model.parameters()],
           "next_loaded": [_flat(p.full_tensor()) for p in model2.parameters()]}
    dist.destroy_process_group()
    return out


def _expanded_inputs(r: int, n: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(got, want) of ops whose input is an expanded tensor or a strided slice on the odd ranks
    (the root's tensor of a broadcast: on rank 0). c10d's gloo gets the gathers right and sends
    wrong numbers from the root of a scatter or a broadcast."""
    def val(x: float, k: int) -> torch.Tensor:
        return torch.tensor([x]).expand(k) if r % 2 else torch.full((k,), x)

    ag = [torch.zeros(3) for _ in range(n)]
    dist.all_gather(ag, val(r + 1.0, 3))
    ga = [torch.zeros(2) for _ in range(n)]
    dist.gather(val(r + 5.0, 2), ga if r == 0 else None, dst=0)
    a2a = [torch.zeros(2) for _ in range(n)]
    dist.all_to_all(a2a, [val(10.0 * r + q, 2) for q in range(n)])
    sc = torch.zeros(2)
    dist.scatter(sc, [torch.tensor([q + 7.0]).expand(2) for q in range(n)] if r == 0 else None, src=0)
    bx, bs = torch.tensor([3.0]).expand(4) if r == 0 else torch.zeros(4), torch.zeros(4)
    dist.broadcast(bx, src=0)
    dist.broadcast(torch.arange(8.0)[::2] if r == 0 else bs, src=0)
    got = torch.zeros(3)
    for w in (dist.isend(val(r + 20.0, 3), dst=(r + 1) % n), dist.irecv(got, src=(r - 1) % n)):
        w.wait()
    def rows(f: Any, k: int) -> torch.Tensor:
        return torch.stack([torch.full((k,), float(f(q))) for q in range(n)])

    return {
        "all_gather/expanded_input": (torch.stack(ag), rows(lambda q: q + 1, 3)),
        "gather/expanded_input": (torch.stack(ga), rows(lambda q: (q + 5) * (r == 0), 2)),
        "all_to_all/expanded_inputs": (torch.stack(a2a), rows(lambda q: 10 * q + r, 2)),
        "scatter/expanded_inputs": (sc, torch.full((2,), r + 7.0)),
        "broadcast/expanded_root": (bx, torch.full((4,), 3.0)),
        "broadcast/strided_root": (bs, torch.zeros(4) if r == 0 else torch.arange(0.0, 8.0, 2.0)),
        "send_recv/expanded": (got, torch.full((3,), (r - 1) % n + 20.0)),
    }


def _copied_layouts(r: int, n: int) -> dict[str, Any]:
    """(got, want) of ops on views that are not contiguous, which the route runs through contiguous
    copies: c10d's gloo runs the list forms right, and refuses 2-D outputs of the ``*_tensor`` ops
    and the views of send and recv (on the side that has one: the peer went on waiting)."""
    cols = torch.zeros(3, 2 * n)
    dist.all_gather(list(cols.chunk(n, dim=1)), torch.full((3, 2), float(r + 1)) + torch.arange(3.0)[:, None])
    want_cols = torch.cat([torch.full((3, 2), float(q + 1)) + torch.arange(3.0)[:, None] for q in range(n)], dim=1)
    outs = [torch.zeros(3) for _ in range(n)]
    dist.all_gather(outs, (torch.arange(12.0).reshape(3, 4) + r)[:, 1])
    gathered = torch.zeros(2, n)
    dist.gather(torch.full((2,), float(r)), list(gathered.unbind(1)) if r == 0 else None, dst=0)
    a2a = torch.zeros(2, n)
    dist.all_to_all(list(a2a.unbind(1)), list((torch.arange(2.0 * n).reshape(2, n) + 10 * r).unbind(1)))
    rs = torch.zeros(2)
    dist.reduce_scatter(rs, list((torch.arange(2.0 * n).reshape(2, n) + r).unbind(1)))
    sc = torch.zeros(2)
    dist.scatter(sc, list(torch.arange(2.0 * n).reshape(2, n).unbind(1)) if r == 0 else None, src=0)
    agt = torch.zeros(2, n).t()
    dist.all_gather_into_tensor(agt, torch.tensor([1.0, 2.0]) + 10 * r)
    rst = torch.zeros(2, 2).t()
    dist.reduce_scatter_tensor(rst, torch.arange(4.0 * n) + r)
    per_rank = sum(torch.arange(4.0 * n) + q for q in range(n))
    nxt, prev, grid = (r + 1) % n, (r - 1) % n, torch.arange(6.0).reshape(2, 3)
    ring, batched = torch.zeros(2, 3), torch.zeros(2, 3)
    for w in (dist.isend((grid + 10 * r)[:, 1], dst=nxt), dist.irecv(ring[:, 1], src=prev)):
        w.wait()
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, (grid + 10 * r)[:, 2], nxt),
                                     dist.P2POp(dist.irecv, batched[:, 2], prev)]):
        w.wait()
    from_prev = torch.zeros(2, 3)
    pairs = _expanded_inputs(r, n)
    pairs.update({
        "all_gather/column_outputs": (cols, want_cols),
        "all_gather/column_input": (torch.stack(outs), torch.stack([torch.tensor([1.0, 5, 9]) + q for q in range(n)])),
        "gather/column_outputs": (gathered, torch.arange(float(n)).expand(2, n) if r == 0 else torch.zeros(2, n)),
        "all_to_all/columns": (a2a, torch.stack([torch.tensor([r, n + r]) + 10.0 * q for q in range(n)], dim=1)),
        "reduce_scatter/column_inputs": (rs, sum(torch.tensor([r, n + r]) + float(q) for q in range(n))),
        "scatter/column_inputs": (sc, torch.tensor([r, n + r], dtype=torch.float32)),
        "all_gather_into_tensor/transposed": (agt, torch.stack([torch.tensor([1.0, 2.0]) + 10 * q for q in range(n)])),
        "reduce_scatter_tensor/transposed": (rst, per_rank[4 * r: 4 * r + 4].reshape(2, 2)),
        "send_recv/columns": (ring, from_prev.index_copy(1, torch.tensor([1]), (grid + 10 * prev)[:, 1:2])),
        "batch_isend_irecv/columns": (batched, from_prev.index_copy(1, torch.tensor([2]), (grid + 10 * prev)[:, 2:3])),
    })
    return {name: [_flat(got), _flat(want)] for name, (got, want) in pairs.items()}


def strided_layouts() -> dict[str, Any]:
    """Views that are not contiguous: refused before anything leaves the process where c10d's gloo
    gives wrong numbers (an all-reduce of a strided slice: its memory reduced as if it were
    contiguous) or cannot write back (an expanded output), else run through contiguous copies
    (:func:`_copied_layouts`); then the world all-reduces."""
    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    calls = {
        "all_reduce": lambda: dist.all_reduce(torch.arange(12.0).reshape(3, 4)[:, 1]),
        "all_reduce/expanded": lambda: dist.all_reduce(torch.ones(1).expand(4)),
        "scatter/column_output": lambda: dist.scatter(torch.zeros(2, 2)[:, 0], [torch.ones(2)] * n if r == 0 else None),
    }
    out: dict[str, Any] = {"copied": _copied_layouts(r, n)}
    for name, call in calls.items():
        try:
            call()
            out[name] = "no error"
        except Exception as e:  # noqa: BLE001 - reported to the test
            out[name] = [type(e).__name__, "ValueError" in [c.__name__ for c in type(e).__mro__], str(e)]
    t = torch.ones(1)
    dist.all_reduce(t)
    out["after"] = t.item()
    dist.destroy_process_group()
    return out


def rank_and_world_size_arguments() -> dict[str, Any]:
    """``init_process_group("gloo", rank=r, world_size=n)`` as ``mp.spawn``'s programs call it:
    MASTER_ADDR/MASTER_PORT in the environment, no rank or size variable."""
    import os

    r, n = int(os.environ.pop("TORCHCOMM_RANK")), int(os.environ.pop("TORCHCOMM_SIZE"))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(var, None)
    dist.init_process_group("gloo", rank=r, world_size=n)
    t = torch.full((2,), float(r + 1))
    dist.all_reduce(t)
    b = torch.full((1,), float(r))
    dist.broadcast(b, src=n - 1)
    outs = [torch.zeros(1) for _ in range(n)]
    dist.all_gather(outs, torch.full((1,), float(10 * r)))
    out = {"rank": dist.get_rank(), "sum": t.tolist(), "broadcast": b.tolist(), "gathered": [o.item() for o in outs]}
    dist.destroy_process_group()
    return out
