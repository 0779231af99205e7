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
    def _tile(base, offs, stride, offs_d, S):
        """Rows ``offs`` (< S) of a (S, D) matrix at ``base`` with row stride ``stride``; 0 past S."""
        return tl.load(base + offs[:, None] * stride + offs_d[None, :], mask=offs[:, None] < S, other=0.0)

    @triton.jit
    def _store_tile(base, offs, stride, offs_d, S, value):
        tl.store(base + offs[:, None] * stride + offs_d[None, :], value.to(base.dtype.element_ty),
                 mask=offs[:, None] < S)

    @triton.jit
    def _in_window(offs_m, offs_n, S, W):
        """Which (query, key) pairs of the tile attend: q - W < kv <= q, both inside the sequence."""
        diff = offs_m[:, None] - offs_n[None, :]
        return (diff >= 0) & (diff < W) & (offs_m[:, None] < S) & (offs_n[None, :] < S)

    @triton.jit
    def _key_blocks(start_m, S, W, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """[lo, hi): the key range (aligned to BLOCK_N) that query block ``start_m`` reaches."""
        lo = tl.maximum(start_m * BLOCK_M - W + 1, 0)
        return (lo // BLOCK_N) * BLOCK_N, tl.minimum((start_m + 1) * BLOCK_M, S)

    @triton.jit
    def _probs(q, k, lse, keep, qk_scale):
        """Softmax probabilities of a tile from the saved LSE (0 outside the window)."""
        qk = tl.dot(q, tl.trans(k)).to(tl.float32) * qk_scale
        return tl.where(keep, tl.exp2(qk - lse[:, None] * 1.4426950408889634), 0.0)

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
        q = _tile(Q + b * sqb + h * sqh, offs_m, sqs, offs_d, S)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        lo, hi = _key_blocks(start_m, S, W, BLOCK_M, BLOCK_N)
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = _tile(K + b * skb + hk * skh, offs_n, sks, offs_d, S)
            v = _tile(V + b * svb + hk * svh, offs_n, svs, offs_d, S)
            qk = tl.dot(q, tl.trans(k)).to(tl.float32) * qk_scale
            qk = tl.where(_in_window(offs_m, offs_n, S, W), qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet
            p = tl.exp2(qk - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m_i = m_new
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        _store_tile(O + b * sob + h * soh, offs_m, sos, offs_d, S, acc / l_safe[:, None])
        tl.store(LSE + bh * S + offs_m, (m_i + tl.log2(l_safe)) * 0.6931471805599453, mask=offs_m < S)

    @triton.jit
    def _bwd_delta(O, DO, DELTA, S, HQ, sob, soh, sos, sdb, sdh, sds,
                   D: tl.constexpr, BLOCK_M: tl.constexpr):
        start_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // HQ
        h = bh % HQ
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        o = _tile(O + b * sob + h * soh, offs_m, sos, offs_d, S)
        do = _tile(DO + b * sdb + h * sdh, offs_m, sds, offs_d, S)
        tl.store(DELTA + bh * S + offs_m, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=offs_m < S)

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
        k = _tile(K + b * skb + hk * skh, offs_n, sks, offs_d, S)
        v = _tile(V + b * svb + hk * svh, offs_n, svs, offs_d, S)
        dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        # the queries that see these keys: kv <= q < kv + W
        lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M
        hi = tl.minimum((start_n + 1) * BLOCK_N - 1 + W, S)
        for g in range(0, GROUP):  # every query head this kv head serves
            h = hk * GROUP + g
            bh = b * HQ + h
            for start_m in range(lo, hi, BLOCK_M):
                offs_m = start_m + tl.arange(0, BLOCK_M)
                q = _tile(Q + b * sqb + h * sqh, offs_m, sqs, offs_d, S)
                do = _tile(DO + b * sdb + h * sdh, offs_m, sds, offs_d, S)
                lse = tl.load(LSE + bh * S + offs_m, mask=offs_m < S, other=0.0)
                delta = tl.load(DELTA + bh * S + offs_m, mask=offs_m < S, other=0.0)
                p = _probs(q, k, lse, _in_window(offs_m, offs_n, S, W), qk_scale)
                dv += tl.dot(tl.trans(p.to(do.dtype)), do).to(tl.float32)
                ds = p * (tl.dot(do, tl.trans(v)).to(tl.float32) - delta[:, None])
                dk += tl.dot(tl.trans(ds.to(q.dtype)), q).to(tl.float32)
        _store_tile(DK + b * skb + hk * skh, offs_n, sks, offs_d, S, dk * sm_scale)
        _store_tile(DV + b * svb + hk * svh, offs_n, svs, offs_d, S, dv)

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
        q = _tile(Q + b * sqb + h * sqh, offs_m, sqs, offs_d, S)
        do = _tile(DO + b * sdb + h * sdh, offs_m, sds, offs_d, S)
        lse = tl.load(LSE + bh * S + offs_m, mask=offs_m < S, other=0.0)
        delta = tl.load(DELTA + bh * S + offs_m, mask=offs_m < S, other=0.0)
        dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        lo, hi = _key_blocks(start_m, S, W, BLOCK_M, BLOCK_N)
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = _tile(K + b * skb + hk * skh, offs_n, sks, offs_d, S)
            v = _tile(V + b * svb + hk * svh, offs_n, svs, offs_d, S)
            p = _probs(q, k, lse, _in_window(offs_m, offs_n, S, W), qk_scale)
            ds = p * (tl.dot(do, tl.trans(v)).to(tl.float32) - delta[:, None])
            dq += tl.dot(ds.to(k.dtype), k).to(tl.float32)
        _store_tile(DQ + b * sqb + h * sqh, offs_m, sqs, offs_d, S, dq * sm_scale)


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
