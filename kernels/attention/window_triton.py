"""A dedicated Triton kernel for causal sliding-window attention (forward and backward).

Each query block reads only the key blocks its window reaches (``q - window < kv <= q``), so
the work is O(S · window) rather than O(S²), with no block mask to build. Grouped-query
attention is handled inside the kernels (a key/value head serves its query heads); the
backward is deterministic (no atomics): one kernel accumulates dK/dV per key block, another dQ
per query block. Runs on CUDA, and on CPU under ``TRITON_INTERPRET=1`` (for tests).

Status: correct against the float64 reference (tests run it in Triton's interpreter); its
block sizes are untuned guesses until it is measured on a GPU, so ``attention(backend="auto")``
does not pick it — ask for it with ``backend="triton_window"``.
"""
from __future__ import annotations

import math
import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is missing
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]

from .errors import AttentionInputError

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


def available(device: torch.device) -> str | None:
    """``None`` if the kernel can run on ``device``, else why not."""
    if triton is None:
        return "the sliding-window kernel needs Triton, which is not installed"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return f"the sliding-window kernel runs on CUDA (or CPU under TRITON_INTERPRET=1), not {device.type}"


if triton is not None:

    @triton.jit
    def _fwd(Q, K, V, O, LSE, sm_scale, S, W, GROUP, HQ,
             sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
             D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        start_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // HQ
        h = bh % HQ
        hk = h // GROUP
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        q_ptrs = Q + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :]
        q = tl.load(q_ptrs, mask=offs_m[:, None] < S, other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        lo = tl.maximum(start_m * BLOCK_M - W + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        hi = tl.minimum((start_m + 1) * BLOCK_M, S)
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * sks + offs_d[None, :],
                        mask=offs_n[:, None] < S, other=0.0)
            v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svs + offs_d[None, :],
                        mask=offs_n[:, None] < S, other=0.0)
            qk = tl.dot(q, tl.trans(k)).to(tl.float32) * qk_scale
            diff = offs_m[:, None] - offs_n[None, :]
            keep = (diff >= 0) & (diff < W) & (offs_n[None, :] < S)
            qk = tl.where(keep, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(qk - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m_i = m_new
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_safe[:, None]
        tl.store(O + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :], out.to(O.dtype.element_ty),
                 mask=offs_m[:, None] < S)
        lse = (m_i + tl.log2(l_safe)) * 0.6931471805599453
        tl.store(LSE + bh * S + offs_m, lse, mask=offs_m < S)

    @triton.jit
    def _bwd_delta(O, DO, DELTA, S, HQ, sob, soh, sos, sdb, sdh, sds,
                   D: tl.constexpr, BLOCK_M: tl.constexpr):
        start_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // HQ
        h = bh % HQ
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        rows = offs_m[:, None] < S
        o = tl.load(O + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :], mask=rows, other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sds + offs_d[None, :], mask=rows, other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        tl.store(DELTA + bh * S + offs_m, delta, mask=offs_m < S)

    @triton.jit
    def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale, S, W, GROUP, HQ, HKV,
                  sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds,
                  D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        start_n = tl.program_id(0)
        bhk = tl.program_id(1)
        b = bhk // HKV
        hk = bhk % HKV
        offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, D)
        cols = offs_n[:, None] < S
        k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * sks + offs_d[None, :], mask=cols, other=0.0)
        v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svs + offs_d[None, :], mask=cols, other=0.0)
        dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M
        hi = tl.minimum((start_n + 1) * BLOCK_N - 1 + W, S)
        for g in range(0, GROUP):
            h = hk * GROUP + g
            bh = b * HQ + h
            for start_m in range(lo, hi, BLOCK_M):
                offs_m = start_m + tl.arange(0, BLOCK_M)
                rows = offs_m[:, None] < S
                q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :], mask=rows, other=0.0)
                do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sds + offs_d[None, :], mask=rows, other=0.0)
                lse = tl.load(LSE + bh * S + offs_m, mask=offs_m < S, other=0.0)
                delta = tl.load(DELTA + bh * S + offs_m, mask=offs_m < S, other=0.0)
                qk = tl.dot(q, tl.trans(k)).to(tl.float32) * qk_scale
                diff = offs_m[:, None] - offs_n[None, :]
                keep = (diff >= 0) & (diff < W) & (offs_m[:, None] < S) & (offs_n[None, :] < S)
                p = tl.where(keep, tl.exp2(qk - lse[:, None] * 1.4426950408889634), 0.0)
                dv += tl.dot(tl.trans(p.to(do.dtype)), do).to(tl.float32)
                dp = tl.dot(do, tl.trans(v)).to(tl.float32)
                ds = p * (dp - delta[:, None])
                dk += tl.dot(tl.trans(ds.to(q.dtype)), q).to(tl.float32)
        tl.store(DK + b * skb + hk * skh + offs_n[:, None] * sks + offs_d[None, :],
                 (dk * sm_scale).to(DK.dtype.element_ty), mask=cols)
        tl.store(DV + b * svb + hk * svh + offs_n[:, None] * svs + offs_d[None, :],
                 dv.to(DV.dtype.element_ty), mask=cols)

    @triton.jit
    def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, S, W, GROUP, HQ,
                sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds,
                D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        start_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // HQ
        h = bh % HQ
        hk = h // GROUP
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        rows = offs_m[:, None] < S
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :], mask=rows, other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sds + offs_d[None, :], mask=rows, other=0.0)
        lse = tl.load(LSE + bh * S + offs_m, mask=offs_m < S, other=0.0)
        delta = tl.load(DELTA + bh * S + offs_m, mask=offs_m < S, other=0.0)
        dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        lo = tl.maximum(start_m * BLOCK_M - W + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        hi = tl.minimum((start_m + 1) * BLOCK_M, S)
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * sks + offs_d[None, :],
                        mask=offs_n[:, None] < S, other=0.0)
            v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svs + offs_d[None, :],
                        mask=offs_n[:, None] < S, other=0.0)
            qk = tl.dot(q, tl.trans(k)).to(tl.float32) * qk_scale
            diff = offs_m[:, None] - offs_n[None, :]
            keep = (diff >= 0) & (diff < W) & (offs_m[:, None] < S) & (offs_n[None, :] < S)
            p = tl.where(keep, tl.exp2(qk - lse[:, None] * 1.4426950408889634), 0.0)
            dp = tl.dot(do, tl.trans(v)).to(tl.float32)
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds.to(k.dtype), k).to(tl.float32)
        tl.store(DQ + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :],
                 (dq * sm_scale).to(DQ.dtype.element_ty), mask=rows)


def _blocks(device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): small blocks for the interpreter; untuned GPU guesses."""
    if device.type == "cpu":
        return 16, 16, 1
    return 64, 64, 4


class _WindowAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, window: int, scale: float):  # type: ignore[override]
        q, k, v = (t.contiguous() for t in (q, k, v))
        bsz, hq, s, d = q.shape
        hkv = k.shape[1]
        o = torch.empty_like(q)
        lse = torch.empty((bsz, hq, s), device=q.device, dtype=torch.float32)
        bm, bn, warps = _blocks(q.device)
        grid = (triton.cdiv(s, bm), bsz * hq)
        _fwd[grid](q, k, v, o, lse, scale, s, window, hq // hkv, hq,
                   q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                   v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
                   D=d, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.window, ctx.scale = window, scale
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do: Tensor, _dlse: Tensor):  # type: ignore[override]
        q, k, v, o, lse = ctx.saved_tensors
        do = do.contiguous()
        bsz, hq, s, d = q.shape
        hkv = k.shape[1]
        bm, bn, warps = _blocks(q.device)
        delta = torch.empty_like(lse)
        _bwd_delta[(triton.cdiv(s, bm), bsz * hq)](
            o, do, delta, s, hq, o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2),
            D=d, BLOCK_M=bm, num_warps=warps)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                   v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))
        _bwd_dkdv[(triton.cdiv(s, bn), bsz * hkv)](
            q, k, v, do, lse, delta, dk, dv, ctx.scale, s, ctx.window, hq // hkv, hq, hkv, *strides,
            D=d, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
        _bwd_dq[(triton.cdiv(s, bm), bsz * hq)](
            q, k, v, do, lse, delta, dq, ctx.scale, s, ctx.window, hq // hkv, hq, *strides,
            D=d, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
        return dq, dk, dv, None, None


def window_attention(q: Tensor, k: Tensor, v: Tensor, window: int, *, scale: float | None = None
                     ) -> tuple[Tensor, Tensor]:
    """Causal sliding-window attention (``q - window < kv <= q``): ``(out, lse)``.

    q: (B, Hq, S, D); k, v: (B, Hkv, S, D) with Hq a multiple of Hkv; D a power of two from 16
    to 256. ``lse`` is float32, natural log. Differentiable in q, k and v."""
    why = available(q.device)
    if why is not None:
        raise AttentionInputError(why)
    d = q.shape[-1]
    if q.shape[2] != k.shape[2]:
        raise AttentionInputError(f"the sliding-window kernel needs Sq == Skv, got {q.shape[2]} and {k.shape[2]}")
    if v.shape[-1] != d or d < 16 or d > 256 or d & (d - 1):
        raise AttentionInputError(
            f"the sliding-window kernel needs one head dim, a power of two in 16..256, got q/k {d}, v {v.shape[-1]}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise AttentionInputError(f"window must be a positive int, got {window!r}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out, lse = _WindowAttention.apply(q, k, v, window, scale)
    return out, lse
