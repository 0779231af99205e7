"""The state a healing replica receives: parameter shards and optimizer state, packed into one
buffer per dtype and sent point to point on the replicate communicator. The layout (which
optimizer state each parameter has, its shapes and dtypes, the param groups' settings) and the
LR scheduler's state travel through the store as JSON (:func:`state_meta`); the tensors never
touch the file system."""
from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

_HYPER_TYPES = (int, float, bool, str, type(None))


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (the tensor itself otherwise)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in the state layout")
    return dt


def _plain(v: Any) -> Any:
    """A JSON-safe copy of a param-group setting, or ``None`` when it has none."""
    if isinstance(v, _HYPER_TYPES):
        return [v]
    if isinstance(v, (tuple, list)) and all(isinstance(x, (int, float)) for x in v):
        return [list(v)]
    return None


def check_scheduler(scheduler: Any) -> None:
    """Raise ``FSDPCommError`` unless ``scheduler`` is None or steps and has a JSON-able state."""
    if scheduler is None:
        return
    from fsdp2.collectives import FSDPCommError

    if not all(callable(getattr(scheduler, m, None)) for m in ("step", "state_dict", "load_state_dict")):
        raise FSDPCommError(f"scheduler must have step(), state_dict() and load_state_dict(), "
                            f"got {type(scheduler).__name__}")
    try:
        json.dumps(scheduler.state_dict())
    except (TypeError, ValueError) as e:
        raise FSDPCommError(f"the state_dict() of scheduler {type(scheduler).__name__} is not JSON ({e}): "
                            f"a replacement could not receive it") from e


def state_meta(params: list[nn.Parameter], optimizer: torch.optim.Optimizer,
               scheduler: Any = None) -> dict[str, Any]:
    """The layout of ``optimizer``'s state for ``params``, its param groups' settings and the
    state of ``scheduler`` (None without one)."""
    per_param = []
    for p in params:
        entry = {}
        for key, v in sorted(optimizer.state.get(p, {}).items()):
            if isinstance(v, torch.Tensor):
                entry[key] = ["tensor", str(v.dtype), list(local_shard(v).shape), hasattr(v, "to_local")]
            elif _plain(v) is not None:
                entry[key] = ["value", v]
        per_param.append(entry)
    groups = [{k: _plain(v)[0] for k, v in g.items() if k != "params" and _plain(v) is not None}
              for g in optimizer.param_groups]
    return {"state": per_param, "groups": groups,
            "scheduler": None if scheduler is None else scheduler.state_dict()}


def _tensors(params: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor sent, in order: each parameter's local shard, then its state's tensors."""
    out = [local_shard(p) for p in params]
    for p in params:
        out += [local_shard(v) for _k, v in sorted(optimizer.state.get(p, {}).items()) if isinstance(v, torch.Tensor)]
    return out


def _by_dtype(tensors: list[torch.Tensor]) -> dict[torch.dtype, list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return dict(sorted(groups.items(), key=lambda kv: str(kv[0])))


@torch.no_grad()
def send_state(comm: Any, dsts: list[int], params: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> None:
    """Send the parameter shards and optimizer state to each rank of ``dsts`` (ranks of ``comm``)."""
    for _dt, ts in _by_dtype(_tensors(params, optimizer)).items():
        buf = torch.cat([t.reshape(-1) for t in ts])
        for d in dsts:
            comm.send(buf, d, async_op=False)


@torch.no_grad()
def receive_state(comm: Any, src: int, params: list[nn.Parameter], optimizer: torch.optim.Optimizer,
                  meta: dict[str, Any], scheduler: Any = None) -> None:
    """Receive what :func:`send_state` sends from ``src``: the parameters are overwritten in
    place, the optimizer state is made to ``meta``'s layout and filled, ``scheduler`` loads the
    sender's state."""
    if len(meta["state"]) != len(params) or len(meta["groups"]) != len(optimizer.param_groups):
        raise ValueError(f"state layout of {len(meta['state'])} parameters / {len(meta['groups'])} groups does not "
                         f"match this model's {len(params)} / {len(optimizer.param_groups)}")
    if (scheduler is None) != (meta.get("scheduler") is None):
        raise ValueError(f"the live replicas {'do not ' if scheduler is not None else ''}step an LR scheduler; "
                         f"this one {'does' if scheduler is not None else 'does not'} (start(..., scheduler=))")
    if scheduler is not None:
        scheduler.load_state_dict(meta["scheduler"])
    for group, settings in zip(optimizer.param_groups, meta["groups"]):
        group.update({k: tuple(v) if isinstance(group.get(k), tuple) else v for k, v in settings.items()})
    for p, entry in zip(params, meta["state"]):
        state: dict[str, Any] = {}
        for key, (kind, *rest) in entry.items():
            if kind == "value":
                state[key] = rest[0]
                continue
            dtype, shape, dtensor = _dtype(rest[0]), rest[1], rest[2]
            local = torch.empty(shape, dtype=dtype, device=local_shard(p).device)
            if dtensor:
                from torch.distributed.tensor import DTensor

                state[key] = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                                                shape=p.shape, stride=p.stride())
            else:
                state[key] = local
        optimizer.state[p] = state
    for _dt, ts in _by_dtype(_tensors(params, optimizer)).items():
        buf = torch.empty(sum(t.numel() for t in ts), dtype=ts[0].dtype, device=ts[0].device)
        comm.recv(buf, src, async_op=False)
        for t, chunk in zip(ts, buf.split([t.numel() for t in ts])):
            t.copy_(chunk.view_as(t))
