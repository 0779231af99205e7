"""Reference implementation: plain PyTorch on materialised logits (used by the tests)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .config import LossConfig, compute_dtype_for


def reference_linear_cross_entropy(
    input: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    cfg: LossConfig,
    class_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(loss, z_loss)`` computed through ``F.cross_entropy`` on full logits.

    Differentiable through ordinary autograd. ``weight`` is ``(C, H)``, or ``(C, *K, H)`` for a
    K-dimensional loss (then ``input`` is ``(N, H)`` or ``(H,)`` and ``target`` ``(N, *K)``/``K``).
    A floating-point ``target`` holds class probabilities: ``input.shape[:-1] + (C,)`` for a 2-D
    weight, ``input.shape[:-1] + (C, *K)`` for a K-dimensional one (the logits' shape).
    The math runs, and results come back, in float32 (float64 for float64 inputs).
    ``z_loss`` is detached (it is already part of ``loss``).
    """
    ct = compute_dtype_for(input.dtype)
    x, w = input.to(ct), weight.to(ct)
    b = bias.to(ct) if bias is not None else None
    cw = class_weight.to(ct) if class_weight is not None else None
    probabilities = target.is_floating_point()
    if w.dim() == 2:
        logits = F.linear(x.reshape(math.prod(x.shape[:-1]), x.shape[-1]), w, b)  # -1 is ambiguous at H = 0
        flat_target = target.reshape(-1, target.shape[-1]).to(ct) if probabilities else target.reshape(-1)
    else:
        batched = x.dim() == 2
        x2 = x if batched else x.unsqueeze(0)
        logits = torch.einsum("nh,c...h->nc...", x2, w)
        if b is not None:
            logits = logits + b
        flat_target = target if batched else target.unsqueeze(0)
        if probabilities:
            flat_target = flat_target.to(ct)
    if cfg.softcap is not None:
        logits = cfg.softcap * torch.tanh(logits / cfg.softcap)
    loss = F.cross_entropy(
        logits,
        flat_target,
        weight=cw,
        ignore_index=cfg.ignore_index,
        reduction=cfg.reduction,
        label_smoothing=cfg.label_smoothing,
    )
    lse = torch.logsumexp(logits, dim=1)
    valid = torch.ones_like(lse, dtype=torch.bool) if probabilities else flat_target != cfg.ignore_index
    zrow = torch.where(valid, cfg.z_loss * lse.square(), torch.zeros_like(lse))
    if cfg.reduction == "mean":
        z = zrow.sum() / valid.sum()
    elif cfg.reduction == "sum":
        z = zrow.sum()
    else:
        z = zrow
    if cfg.z_loss != 0.0:
        loss = loss + z
    if cfg.reduction == "none":
        shape = target.shape
        if probabilities:  # without the class dimension (the one before the weight's K dims)
            class_dim = target.dim() - w.dim() + 1
            shape = shape[:class_dim] + shape[class_dim + 1:]
        loss, z = loss.reshape(shape), z.reshape(shape)
    return loss, z.detach()
