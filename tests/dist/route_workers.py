"""Rank bodies for unchanged torch.distributed programs (DDP, FSDP2, ZeRO, 2-D DeviceMesh with
DTensor tensor parallel, a dead peer), run with TORCH_DISTRIBUTED_USE_TORCHCOMMS on or off."""
from __future__ import annotations

import json
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def _init(device: str) -> torch.device:
    """``init_process_group`` as a user's program calls it: gloo on the CPU, nccl bound to this
    rank's GPU for ``device="cuda"``; returns the device the program's tensors live on."""
    if device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
        return dev
    dist.init_process_group("gloo")
    return torch.device("cpu")


def _attach_recorder(device: torch.device = torch.device("cpu")) -> Any:
    """A flight recorder on the world communicator (it follows the groups split from it)."""
    backend = dist.group.WORLD._get_backend(device)
    if not hasattr(backend, "get_comm"):
        return None
    from torchcomms.hooks import FlightRecorderHook

    rec = FlightRecorderHook(max_entries=100000)
    rec.register_with_comm(backend.get_comm())
    return rec


def _recorded(rec: Any) -> dict[str, int]:
    if rec is None:
        return {}
    ops: dict[str, int] = {}
    for e in json.loads(rec.dump_json())["entries"]:
        ops[e["profiling_name"]] = ops.get(e["profiling_name"], 0) + 1
    return ops


def _data(rank: int, step: int, n: int = 8, d: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, d, generator=g), torch.randn(n, 4, generator=g)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def ddp(steps: int = 3, device: str = "cpu") -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = _init(device)
    rec = _attach_recorder(dev)
    model = DDP(_model().to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        x, y = (t.to(dev) for t in _data(dist.get_rank(), step))
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = [p.detach().flatten().tolist() for p in model.parameters()]
    ops = _recorded(rec)
    dist.destroy_process_group()
    return {"losses": losses, "params": params, "recorded": ops, "routed": rec is not None}


def fsdp2(steps: int = 3, device: str = "cpu") -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dev = _init(device)
    rec = _attach_recorder(dev)
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    model = _model().to(dev)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        x, y = (t.to(dev) for t in _data(dist.get_rank(), step))
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = [p.full_tensor().flatten().tolist() for p in model.parameters()]
    ops = _recorded(rec)
    dist.destroy_process_group()
    return {"losses": losses, "params": params, "recorded": ops, "routed": rec is not None}


def _tree(o: Any) -> Any:
    """``o`` (a state dict) as JSON: tensors as their values, dtype, device and shape."""
    if torch.is_tensor(o):
        return {"values": o.flatten().tolist(), "dtype": str(o.dtype), "device": str(o.device), "shape": list(o.shape)}
    if isinstance(o, dict):
        return {str(k): _tree(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_tree(v) for v in o]
    return o


def zero(steps: int = 2, to: int = 1) -> dict[str, Any]:
    """``ZeroRedundancyOptimizer`` (Adam, two parameter groups) trained, then its state
    consolidated on rank ``to`` and read there (``consolidate_state_dict`` and ``state_dict``)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    dist.init_process_group("gloo")
    rec = _attach_recorder()
    model = _model()
    params = list(model.parameters())
    opt = ZeroRedundancyOptimizer(params[:2], optimizer_class=torch.optim.Adam, lr=0.01)
    opt.add_param_group({"params": params[2:], "lr": 0.05})
    losses = []
    for step in range(steps):
        x, y = _data(dist.get_rank(), step)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        for p in params:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        opt.step()
        losses.append(loss.item())
    opt.consolidate_state_dict(to=to)
    state = _tree(opt.state_dict()) if dist.get_rank() == to else None
    out = {"losses": losses, "params": [p.detach().flatten().tolist() for p in params], "state": state,
           "recorded": _recorded(rec)}
    dist.destroy_process_group()
    return out


def mesh_2d(steps: int = 2) -> dict[str, Any]:
    """dp x tp = 2 x 2: tensor parallel (DTensor) inside, FSDP2 across."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    dist.init_process_group("gloo")
    rec = _attach_recorder()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = _model()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    dp_rank = mesh.get_local_rank("dp")
    for step in range(steps):
        x, y = _data(dp_rank, step)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = [p.full_tensor().flatten().tolist() for p in model.parameters()]
    ops = _recorded(rec)
    groups = {name: dist.get_process_group_ranks(mesh.get_group(name)) for name in ("dp", "tp")}
    backends = sorted({type(mesh.get_group(name)._get_backend(torch.device("cpu"))).__name__
                       for name in ("dp", "tp")})
    dist.destroy_process_group()
    return {"losses": losses, "params": params, "recorded": ops, "groups": groups, "backends": backends}


def dead_peer() -> dict[str, Any]:
    """Rank 1 dies after a first all_reduce; rank 0's next one must raise our typed error."""
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        os._exit(17)
    time.sleep(1.0)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"error": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "message": str(e)[:400],
                "secs": time.monotonic() - start}
    return {"error": None, "secs": time.monotonic() - start}


def subgroup_made_by_c10d_helper() -> dict[str, Any]:
    """A subgroup of ranks 0 and 1 made the way torch 2.11's ``new_group`` makes one (c10d's
    ``_new_group_with_tag``: its process-group helper calls ``new_comm`` with a name and a
    store only), then an all-reduce on it and one on the world."""
    from torch.distributed import distributed_c10d as c10d

    dist.init_process_group("gloo")
    r = dist.get_rank()
    g = c10d._new_group_with_tag([0, 1])
    out: dict[str, Any] = {"member": g is not c10d.GroupMember.NON_GROUP_MEMBER}
    if out["member"]:
        t = torch.full((2,), float(r + 1))
        dist.all_reduce(t, group=g)
        comm = g._get_backend(torch.device("cpu")).get_comm()
        out.update(sum=t.tolist(), rank=comm.get_rank(), size=comm.get_size())
    w = torch.ones(1)
    dist.all_reduce(w)
    out["world"] = w.item()
    dist.destroy_process_group()
    return out


def killed_mid_all_reduce(victim: int) -> dict[str, Any]:
    """Three all-reduces, then rank ``victim`` issues a fourth (16 MB) and SIGKILLs itself while
    it is in flight; the others all-reduce until one fails, then try one more."""
    import signal

    dist.init_process_group("gloo")
    t = torch.ones(1 << 22)
    for _ in range(3):
        dist.all_reduce(t)
    if dist.get_rank() == victim:
        dist.all_reduce(t, async_op=True)
        os.kill(os.getpid(), signal.SIGKILL)
    out: dict[str, Any] = {"steps": 3}
    try:
        for _ in range(10):
            dist.all_reduce(t)
            out["steps"] += 1
    except Exception as e:  # noqa: BLE001 - reported to the test
        out.update(error=type(e).__name__, mro=[c.__name__ for c in type(e).__mro__])
    try:
        dist.all_reduce(torch.ones(1))
        out["after"] = None
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["after"] = type(e).__name__
    return out
