"""Plain-PyTorch attention with an explicit mask: the reference, and the portable path that
returns the log-sum-exp (SDPA does not expose it).

Scores are computed one query chunk at a time, so memory is chunk × kv_len per head rather
than q_len × kv_len; autograd flows through ordinary ops.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .errors import AttentionInputError
from .masks import Mask

__all__ = ["math_attention"]


def math_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | None = None,
    *,
    scale: float | None = None,
    chunk_size: int = 1024,
    compute_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """Attention ``softmax(q kᵀ · scale + mask) v`` and its log-sum-exp.

    q: (B, Hq, Sq, D); k: (B, Hkv, Skv, D); v: (B, Hkv, Skv, Dv), Hq a multiple of Hkv (GQA).
    Returns ``(out, lse)`` with out (B, Hq, Sq, Dv) in q's dtype and lse (B, Hq, Sq) in
    float32 (natural log). Rows with no allowed key give out = 0 and lse = -inf, as FlexAttention does.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        # a negative one made range() empty: no query chunk, an output with no queries
        raise AttentionInputError(f"chunk_size must be a positive int, got {chunk_size!r}")
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    cdt = compute_dtype or (torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype)
    kk = k.to(cdt).repeat_interleave(group, dim=1) if group > 1 else k.to(cdt)
    vv = v.to(cdt).repeat_interleave(group, dim=1) if group > 1 else v.to(cdt)
    dev = q.device
    outs, lses = [], []
    nb = b if (mask is not None and mask.batch_dependent) else 1
    nh = hq if (mask is not None and mask.head_dependent) else 1
    bi = torch.arange(nb, device=dev).view(nb, 1, 1, 1)
    hi = torch.arange(nh, device=dev).view(1, nh, 1, 1)
    kvi = torch.arange(skv, device=dev).view(1, 1, 1, skv)
    mm = mask.to(dev) if mask is not None else None
    for start in range(0, sq, chunk_size):
        stop = min(sq, start + chunk_size)
        s = torch.matmul(q[:, :, start:stop].to(cdt), kk.transpose(-1, -2)) * scale
        if mm is not None:
            qi = torch.arange(start, stop, device=dev).view(1, 1, -1, 1)
            allowed = mm.mask_mod(bi, hi, qi, kvi)
            s = s.masked_fill(~allowed, float("-inf"))
        row_max = s.detach().amax(dim=-1, keepdim=True)
        row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
        e = torch.exp(s - row_max)
        denom = e.sum(dim=-1, keepdim=True)
        p = e / torch.where(denom == 0, torch.ones_like(denom), denom)
        outs.append(torch.matmul(p, vv))
        lses.append((row_max + torch.log(denom)).squeeze(-1))
    if not outs:  # no queries: torch.cat refuses an empty list
        return q.new_empty(b, hq, 0, v.shape[-1]), torch.empty(b, hq, 0, device=dev)
    out = torch.cat(outs, dim=2).to(q.dtype)
    return out, torch.cat(lses, dim=2).float()
