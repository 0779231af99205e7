"""The gradients of an elastic step (``fsdp2.elastic``): laid end to end with a flag per
parameter for the reduction across replicas, copied back, and measured and clipped as
``torch.nn.utils.clip_grad_norm_`` would."""
from __future__ import annotations

import torch
from torch import nn

from fsdp2.collectives import FSDPCommError
from fsdp2.elastic_state import local_shard

__all__ = ["check_max_norm", "clip_to", "copy_flat", "total_norm"]


def check_max_norm(max_grad_norm: float | None) -> None:
    if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float))
                                      or not max_grad_norm > 0):
        raise FSDPCommError(f"max_grad_norm must be a positive number or None, got {max_grad_norm!r}")


def total_norm(params: list[nn.Parameter], grads: list[torch.Tensor], flat: torch.Tensor | None) -> torch.Tensor:
    """The 2-norm of the step's gradient as ``clip_grad_norm_`` computes it (torch's
    ``get_total_norm`` over the DTensor gradients): ``flat``'s reduced parts (see
    :func:`copy_flat`), or with one replica the gradients themselves; a collective on the shard
    communicator, so that it runs before the step is put to ``agree``."""
    from torch.distributed.tensor import DTensor

    if flat is not None:
        parts = flat.split([g.numel() for g in grads] + [len(params)])
        local = [(p, part.view_as(g)) for p, g, part, flag in zip(params, grads, parts, parts[-1].tolist()) if flag]
    else:
        local = [(p, g) for p, g in zip(params, grads) if p.grad is not None]
    tensors = [DTensor.from_local(t, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride()) if isinstance(p, DTensor) else t for p, t in local]
    norm = torch.nn.utils.get_total_norm(tensors)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def clip_to(params: list[nn.Parameter], max_norm: float, norm: torch.Tensor) -> None:
    """Scale the gradients of ``params`` by ``max_norm / norm`` where that is below 1 (torch's
    ``clip_grads_with_norm_``; ``norm`` as a replicated DTensor beside DTensor gradients)."""
    from torch.distributed.tensor import DTensor, Replicate

    params = [p for p in params if p.grad is not None]
    if params and isinstance(params[0], DTensor):
        norm = DTensor.from_local(norm, params[0].device_mesh, [Replicate()] * params[0].device_mesh.ndim,
                                  run_check=False)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)


def copy_flat(flat: torch.Tensor, params: list[nn.Parameter], grads: list[torch.Tensor]) -> None:
    """Copy ``flat`` (the tensors of ``grads`` laid end to end, then a flag per parameter of
    ``params``) back into the gradients: a parameter whose flag is 0 (no gradient on any live
    replica) keeps none, as FSDP leaves it, so the optimizer skips it; one that got a gradient
    elsewhere only is given one here."""
    parts = flat.split([g.numel() for g in grads] + [len(params)])
    for p, g, part, flag in zip(params, grads, parts, parts[-1].tolist()):
        if flag == 0:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
            g = local_shard(p.grad)
        g.copy_(part.view_as(g))
