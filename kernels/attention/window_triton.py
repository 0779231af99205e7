"""A dedicated Triton kernel for causal sliding-window attention (forward and backward).

Each query block reads only the key blocks its window reaches (``q - window < kv <= q``), so
the work is O(S · window) rather than O(S²), with no block mask to build. The key blocks a
query block reaches split into the window's two edges, where the mask is applied, and the
interior, where every pair attends and no mask is computed. Grouped-query attention is handled
inside the kernels (a key/value head serves its query heads); the backward is deterministic (no
atomics): one kernel accumulates dK/dV per key block, another dQ per query block. Runs on
CUDA, and on CPU under ``TRITON_INTERPRET=1`` (for tests).

Block sizes are per kernel and per head dim (:func:`window_config`);
``benchmarks/window_tune.py`` measures the candidates on a GPU. ``attention(backend="auto")``
takes this kernel for causal sliding windows on CUDA in bf16/fp16 at the head dims of
``GPU_CONFIGS`` (measured faster than compiled flex_attention on an H200;
``docs/bench/attention.md``).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is missing
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]

from .errors import AttentionInputError


def available(device: torch.device) -> str | None:
    """``None`` if the kernel can run on ``device``, else why not."""
    if triton is None:
        return "the sliding-window kernel needs Triton, which is not installed"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return f"the sliding-window kernel runs on CUDA (or CPU under TRITON_INTERPRET=1), not {device.type}"


@dataclass(frozen=True)
class Blocks:
    """One kernel's launch shape: query rows and key rows per tile, warps, pipeline stages."""

    block_m: int
    block_n: int
    warps: int = 4
    stages: int = 2

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n}/w{self.warps}/s{self.stages}"


@dataclass(frozen=True)
class WindowConfig:
    """Launch shapes of the three kernels (the backward's delta kernel uses ``dq``'s block_m)."""

    fwd: Blocks
    dkdv: Blocks
    dq: Blocks


#: the interpreter (tests): small tiles keep it fast
INTERPRETER_CONFIG = WindowConfig(Blocks(16, 16, 1, 1), Blocks(16, 16, 1, 1), Blocks(16, 16, 1, 1))
#: CUDA, by head dim; other head dims take the nearest entry
#: (measured by benchmarks/window_tune.py on an H200, S=32768, window 256, bf16, 2026-11-29:
#: 64-row query tiles with 4 warps won every kernel; 8 warps or 128-row tiles were 1.3-4x slower)
GPU_CONFIGS: dict[int, WindowConfig] = {
    64: WindowConfig(Blocks(64, 32, 4, 2), Blocks(64, 64, 4, 2), Blocks(64, 32, 4, 3)),
    128: WindowConfig(Blocks(64, 32, 4, 3), Blocks(64, 64, 4, 2), Blocks(64, 32, 4, 2)),
}


def window_config(device: torch.device, head_dim: int) -> WindowConfig:
    """The launch shapes used for ``head_dim`` on ``device``."""
    if device.type == "cpu":
        return INTERPRETER_CONFIG
    nearest = min(GPU_CONFIGS, key=lambda d: (abs(d - head_dim), d))
    return GPU_CONFIGS[nearest]


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
    def _key_spans(start_m, S, W, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """Key spans (aligned to BLOCK_N) of query block ``start_m``: ``lo <= mid_lo <= mid_hi <= hi``.

        [lo, mid_lo) is the window's far edge and [mid_hi, hi) the diagonal, both masked;
        every pair of [mid_lo, mid_hi) attends (q - W < kv <= q for every row of the block)."""
        m0 = start_m * BLOCK_M
        lo = (tl.maximum(m0 - W + 1, 0) // BLOCK_N) * BLOCK_N
        hi = tl.minimum(m0 + BLOCK_M, S)
        mid_hi = tl.maximum(((m0 + 1) // BLOCK_N) * BLOCK_N, lo)
        if m0 + BLOCK_M > S:  # a ragged last block: its missing rows are masked everywhere
            mid_hi = lo
        mid_lo = ((tl.maximum(m0 + BLOCK_M - W, 0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
        mid_lo = tl.minimum(tl.maximum(mid_lo, lo), mid_hi)
        return lo, mid_lo, mid_hi, hi

    @triton.jit
    def _query_spans(start_n, S, W, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """Query spans (aligned to BLOCK_M) that see key block ``start_n``: ``lo <= mid_lo <= mid_hi <= hi``.

        [lo, mid_lo) is the diagonal and [mid_hi, hi) the window's far edge, both masked;
        every pair of [mid_lo, mid_hi) attends."""
        n0 = start_n * BLOCK_N
        lo = (n0 // BLOCK_M) * BLOCK_M
        hi = tl.minimum(n0 + BLOCK_N - 1 + W, S)
        mid_lo = ((n0 + BLOCK_N - 1 + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
        mid_hi = tl.minimum(((n0 + W) // BLOCK_M) * BLOCK_M, (S // BLOCK_M) * BLOCK_M)
        if n0 + BLOCK_N > S:  # a ragged last key block is masked everywhere
            mid_hi = lo
        mid_lo = tl.minimum(tl.maximum(mid_lo, lo), hi)
        mid_hi = tl.minimum(tl.maximum(mid_hi, mid_lo), hi)
        return lo, mid_lo, mid_hi, hi

    @triton.jit
    def _kv_bases(K, V, b, hk, skb, skh, svb, svh):
        """Where kv head ``hk`` of batch ``b`` starts in K and in V."""
        return K + b * skb + hk * skh, V + b * svb + hk * svh

    @triton.jit
    def _probs(q, k, lse2, keep, qk_scale, MASKED: tl.constexpr):
        """Softmax probabilities of a tile from the saved log2-sum-exp (0 outside the window)."""
        p = tl.exp2(tl.dot(q, tl.trans(k)).to(tl.float32) * qk_scale - lse2[:, None])
        if MASKED:
            p = tl.where(keep, p, 0.0)
        return p

    @triton.jit
    def _fwd_span(acc, m_i, l_i, q, Kb, Vb, offs_m, offs_d, lo, hi, S, W, sks, svs, qk_scale,
                  MASKED: tl.constexpr, BLOCK_N: tl.constexpr):
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = _tile(Kb, offs_n, sks, offs_d, S)
            v = _tile(Vb, offs_n, svs, offs_d, S)
            qk = tl.dot(q, tl.trans(k)).to(tl.float32) * qk_scale
            if MASKED:
                qk = tl.where(_in_window(offs_m, offs_n, S, W), qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = m_new
            if MASKED:
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet
            p = tl.exp2(qk - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m_i = m_new
        return acc, m_i, l_i

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
        Kb, Vb = _kv_bases(K, V, b, hk, skb, skh, svb, svh)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        lo, mid_lo, mid_hi, hi = _key_spans(start_m, S, W, BLOCK_M, BLOCK_N)
        acc, m_i, l_i = _fwd_span(acc, m_i, l_i, q, Kb, Vb, offs_m, offs_d, lo, mid_lo, S, W, sks, svs,
                                  qk_scale, True, BLOCK_N)
        acc, m_i, l_i = _fwd_span(acc, m_i, l_i, q, Kb, Vb, offs_m, offs_d, mid_lo, mid_hi, S, W, sks, svs,
                                  qk_scale, False, BLOCK_N)
        acc, m_i, l_i = _fwd_span(acc, m_i, l_i, q, Kb, Vb, offs_m, offs_d, mid_hi, hi, S, W, sks, svs,
                                  qk_scale, True, BLOCK_N)
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        _store_tile(O + b * sob + h * soh, offs_m, sos, offs_d, S, acc / l_safe[:, None])
        # the LSE is kept in log2 units (what the backward needs); the wrapper converts for callers
        tl.store(LSE + bh * S + offs_m, m_i + tl.log2(l_safe), mask=offs_m < S)

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
    def _dkdv_span(dk, dv, k, v, Qb, DOb, LSEb, DELTAb, offs_n, offs_d, lo, hi, S, W, sqs, sds, qk_scale,
                   MASKED: tl.constexpr, BLOCK_M: tl.constexpr):
        for start_m in range(lo, hi, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            q = _tile(Qb, offs_m, sqs, offs_d, S)
            do = _tile(DOb, offs_m, sds, offs_d, S)
            lse2 = tl.load(LSEb + offs_m, mask=offs_m < S, other=0.0)
            delta = tl.load(DELTAb + offs_m, mask=offs_m < S, other=0.0)
            p = _probs(q, k, lse2, _in_window(offs_m, offs_n, S, W), qk_scale, MASKED)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do).to(tl.float32)
            ds = p * (tl.dot(do, tl.trans(v)).to(tl.float32) - delta[:, None])
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q).to(tl.float32)
        return dk, dv

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
        Kb, Vb = _kv_bases(K, V, b, hk, skb, skh, svb, svh)
        k = _tile(Kb, offs_n, sks, offs_d, S)
        v = _tile(Vb, offs_n, svs, offs_d, S)
        dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        lo, mid_lo, mid_hi, hi = _query_spans(start_n, S, W, BLOCK_M, BLOCK_N)
        for g in range(0, GROUP):  # every query head this kv head serves
            h = hk * GROUP + g
            bh = b * HQ + h
            Qb = Q + b * sqb + h * sqh
            DOb = DO + b * sdb + h * sdh
            dk, dv = _dkdv_span(dk, dv, k, v, Qb, DOb, LSE + bh * S, DELTA + bh * S, offs_n, offs_d,
                                lo, mid_lo, S, W, sqs, sds, qk_scale, True, BLOCK_M)
            dk, dv = _dkdv_span(dk, dv, k, v, Qb, DOb, LSE + bh * S, DELTA + bh * S, offs_n, offs_d,
                                mid_lo, mid_hi, S, W, sqs, sds, qk_scale, False, BLOCK_M)
            dk, dv = _dkdv_span(dk, dv, k, v, Qb, DOb, LSE + bh * S, DELTA + bh * S, offs_n, offs_d,
                                mid_hi, hi, S, W, sqs, sds, qk_scale, True, BLOCK_M)
        _store_tile(DK + b * skb + hk * skh, offs_n, sks, offs_d, S, dk * sm_scale)
        _store_tile(DV + b * svb + hk * svh, offs_n, svs, offs_d, S, dv)

    @triton.jit
    def _dq_span(dq, q, do, lse2, delta, Kb, Vb, offs_m, offs_d, lo, hi, S, W, sks, svs, qk_scale,
                 MASKED: tl.constexpr, BLOCK_N: tl.constexpr):
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = _tile(Kb, offs_n, sks, offs_d, S)
            v = _tile(Vb, offs_n, svs, offs_d, S)
            p = _probs(q, k, lse2, _in_window(offs_m, offs_n, S, W), qk_scale, MASKED)
            ds = p * (tl.dot(do, tl.trans(v)).to(tl.float32) - delta[:, None])
            dq += tl.dot(ds.to(k.dtype), k).to(tl.float32)
        return dq

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
        lse2 = tl.load(LSE + bh * S + offs_m, mask=offs_m < S, other=0.0)
        delta = tl.load(DELTA + bh * S + offs_m, mask=offs_m < S, other=0.0)
        Kb, Vb = _kv_bases(K, V, b, hk, skb, skh, svb, svh)
        dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        lo, mid_lo, mid_hi, hi = _key_spans(start_m, S, W, BLOCK_M, BLOCK_N)
        dq = _dq_span(dq, q, do, lse2, delta, Kb, Vb, offs_m, offs_d, lo, mid_lo, S, W, sks, svs, qk_scale,
                      True, BLOCK_N)
        dq = _dq_span(dq, q, do, lse2, delta, Kb, Vb, offs_m, offs_d, mid_lo, mid_hi, S, W, sks, svs, qk_scale,
                      False, BLOCK_N)
        dq = _dq_span(dq, q, do, lse2, delta, Kb, Vb, offs_m, offs_d, mid_hi, hi, S, W, sks, svs, qk_scale,
                      True, BLOCK_N)
        _store_tile(DQ + b * sqb + h * sqh, offs_m, sqs, offs_d, S, dq * sm_scale)


def _qkv_strides(*tensors: Tensor) -> tuple[int, ...]:
    return tuple(s for t in tensors for s in t.stride()[:3])


def launch_forward(q: Tensor, k: Tensor, v: Tensor, window: int, scale: float, blocks: Blocks
                   ) -> tuple[Tensor, Tensor]:
    """Run the forward kernel: ``(out, lse2)`` with the LSE in log2 units (float32)."""
    bsz, hq, s, d = q.shape
    o = torch.empty_like(q)
    lse2 = torch.empty((bsz, hq, s), device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(s, blocks.block_m), bsz * hq)
    _fwd[grid](q, k, v, o, lse2, scale, s, window, hq // k.shape[1], hq, *_qkv_strides(q, k, v, o),
               D=d, BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, num_warps=blocks.warps,
               num_stages=blocks.stages)
    return o, lse2


def launch_delta(o: Tensor, do: Tensor, blocks: Blocks) -> Tensor:
    """rowsum(O · dO), float32, (B, Hq, S)."""
    bsz, hq, s, d = o.shape
    delta = torch.empty((bsz, hq, s), device=o.device, dtype=torch.float32)
    _bwd_delta[(triton.cdiv(s, blocks.block_m), bsz * hq)](
        o, do, delta, s, hq, *_qkv_strides(o, do), D=d, BLOCK_M=blocks.block_m, num_warps=blocks.warps)
    return delta


def launch_dkdv(q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse2: Tensor, delta: Tensor, window: int,
                scale: float, blocks: Blocks) -> tuple[Tensor, Tensor]:
    """Run the dK/dV kernel (one program per key block and kv head)."""
    bsz, hq, s, d = q.shape
    hkv = k.shape[1]
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    _bwd_dkdv[(triton.cdiv(s, blocks.block_n), bsz * hkv)](
        q, k, v, do, lse2, delta, dk, dv, scale, s, window, hq // hkv, hq, hkv, *_qkv_strides(q, k, v, do),
        D=d, BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, num_warps=blocks.warps, num_stages=blocks.stages)
    return dk, dv


def launch_dq(q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse2: Tensor, delta: Tensor, window: int,
              scale: float, blocks: Blocks) -> Tensor:
    """Run the dQ kernel (one program per query block and query head)."""
    bsz, hq, s, d = q.shape
    dq = torch.empty_like(q)
    _bwd_dq[(triton.cdiv(s, blocks.block_m), bsz * hq)](
        q, k, v, do, lse2, delta, dq, scale, s, window, hq // k.shape[1], hq, *_qkv_strides(q, k, v, do),
        D=d, BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, num_warps=blocks.warps, num_stages=blocks.stages)
    return dq


class _WindowAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, window: int, scale: float):  # type: ignore[override]
        q, k, v = (t.contiguous() for t in (q, k, v))
        cfg = window_config(q.device, q.shape[-1])
        o, lse2 = launch_forward(q, k, v, window, scale, cfg.fwd)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.window, ctx.scale, ctx.cfg = window, scale, cfg
        lse = lse2 * math.log(2.0)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do: Tensor, _dlse: Tensor):  # type: ignore[override]
        q, k, v, o, lse2 = ctx.saved_tensors
        do = do.contiguous()
        cfg: WindowConfig = ctx.cfg
        delta = launch_delta(o, do, cfg.dq)
        dk, dv = launch_dkdv(q, k, v, do, lse2, delta, ctx.window, ctx.scale, cfg.dkdv)
        dq = launch_dq(q, k, v, do, lse2, delta, ctx.window, ctx.scale, cfg.dq)
        return dq, dk, dv, None, None


def unsupported(q: Tensor, k: Tensor, v: Tensor, window: object) -> str | None:
    """``None`` if the kernel computes this problem, else why not."""
    why = available(q.device)
    if why is not None:
        return why
    d = q.shape[-1]
    if q.shape[2] != k.shape[2]:
        return f"the sliding-window kernel needs Sq == Skv, got {q.shape[2]} and {k.shape[2]}"
    if v.shape[-1] != d or d < 16 or d > 256 or d & (d - 1):
        return f"the sliding-window kernel needs one head dim, a power of two in 16..256, got q/k {d}, v {v.shape[-1]}"
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        return f"window must be a positive int, got {window!r}"
    return None


def window_attention(q: Tensor, k: Tensor, v: Tensor, window: int, *, scale: float | None = None
                     ) -> tuple[Tensor, Tensor]:
    """Causal sliding-window attention (``q - window < kv <= q``): ``(out, lse)``.

    q: (B, Hq, S, D); k, v: (B, Hkv, S, D) with Hq a multiple of Hkv; D a power of two from 16
    to 256. ``lse`` is float32, natural log. Differentiable in q, k and v."""
    why = unsupported(q, k, v, window)
    if why is not None:
        raise AttentionInputError(why)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    out, lse = _WindowAttention.apply(q, k, v, window, scale)
    return out, lse
