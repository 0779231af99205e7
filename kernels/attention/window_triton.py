"""A dedicated Triton kernel for causal sliding-window attention (forward and backward).

Each query block reads only the key blocks its window reaches (``q - window < kv <= q``), so
the work is O(S · window) rather than O(S²), with no block mask to build. Every program runs
one loop over its tiles (one software pipeline); only the tiles on the window's two edges
compute the mask. Grouped-query attention is handled inside the kernels (a key/value head
serves its query heads; the dK/dV kernel's loop runs over the whole group). The backward is
deterministic (no atomics): one kernel accumulates dK/dV per key block (on keys x queries
tiles, so that P^T and dS^T feed its products from registers) and, optionally, stores every
tile's dS, so that dQ is one matrix product per tile; or a dQ kernel recomputes them.
On Hopper the tiles are loaded through TMA descriptors. Runs on CUDA, and on CPU under
``TRITON_INTERPRET=1`` (for tests).

Launch shapes are per kernel and per head dim (:func:`window_config`);
``benchmarks/diagnostics/window_tune.py`` measures the candidates on a GPU and
``benchmarks/diagnostics/window_static.py`` reads their registers and spills from the compiler.
``attention(backend="auto")`` takes this kernel for causal sliding windows on CUDA in
bf16/fp16 at the head dims of ``GPU_CONFIGS`` (measured faster than compiled flex_attention on
an H200; ``docs/bench/attention.md``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - exercised where triton is missing
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    TensorDescriptor = None  # type: ignore[assignment,misc]

from ..triton_launch import Launcher
from .errors import AttentionInputError


#: input dtypes the kernels compute (their products take these tiles and accumulate in float32)
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


#: elements per operand the kernels address (their per-head offsets are 32-bit products)
MAX_ELEMENTS = 2**31 - 1


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
    #: load the tiles through the tensor-memory accelerator (TMA descriptors) instead of pointers
    tma: bool = False

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n}/w{self.warps}/s{self.stages}" + ("/tma" if self.tma else "")


@dataclass(frozen=True)
class WindowConfig:
    """Launch shapes of the kernels (the backward's delta kernel uses ``dq``'s block_m).

    ``dq_from_ds``: when set, the dK/dV kernel also stores every tile's dS and dQ is one matrix
    product per tile over those (its warps and stages; the tiles are ``dkdv``'s), instead of
    the ``dq`` kernel recomputing the probabilities (two more products per tile)."""

    fwd: Blocks
    dkdv: Blocks
    dq: Blocks
    dq_from_ds: Blocks | None = None
    #: the dK/dV kernel computes transposed tiles (keys x queries: S^T = K Q^T, dP^T = V dO^T), so
    #: P^T and dS^T, the left operands of dV += P^T dO and dK += dS^T Q, are already in the
    #: registers' layout instead of going through shared memory behind a CTA barrier each; its dS
    #: tiles are then stored key-major, and the dQ-from-dS kernel reads them so
    dkdv_transposed: bool = False


#: the interpreter (tests): small tiles keep it fast; the dS path for dQ, TMA loads and transposed
#: dK/dV tiles are each covered by the kernel tests' own configurations
INTERPRETER_CONFIG = WindowConfig(Blocks(16, 16, 1, 1), Blocks(16, 16, 1, 1), Blocks(16, 16, 1, 1),
                                  Blocks(16, 16, 1, 1))
#: CUDA, by head dim; other head dims take the nearest entry. Chosen with
#: benchmarks/diagnostics/window_tune.py on an H200 (S=32768, window 256, bf16, kernels timed
#: queued; the numbers are in docs/bench/attention.md): 64x64 tiles with 4 warps and TMA loads are
#: the fastest shape of every kernel at both head dims (forward 0.501 ms at 32x128, 0.302 ms at
#: 32/8x64). dQ from stored dS is faster at head dim 128 (f+b 2.239 vs 2.296 ms recomputing) and
#: slower at 64 (1.386 vs 1.316). The dK/dV kernel on transposed tiles is faster at both (dK/dV
#: with dS stores 1.087 vs 1.187 ms at 32x128, 0.479 vs 0.611 at 32/8x64).
GPU_CONFIGS: dict[int, WindowConfig] = {
    64: WindowConfig(Blocks(64, 64, 4, 2, tma=True), Blocks(64, 64, 4, 3, tma=True), Blocks(64, 64, 4, 2, tma=True),
                     dkdv_transposed=True),
    128: WindowConfig(Blocks(64, 64, 4, 3, tma=True), Blocks(64, 64, 4, 2, tma=True), Blocks(64, 64, 4, 2, tma=True),
                      Blocks(64, 64, 4, 4, tma=True), dkdv_transposed=True),
}
#: the dS buffer's largest size; past it the backward recomputes dS for dQ instead
DS_BUFFER_LIMIT_BYTES = 4 << 30


def window_config(device: torch.device, head_dim: int) -> WindowConfig:
    """The launch shapes used for ``head_dim`` on ``device`` (TMA loads only where the GPU has
    the unit: compute capability 9.0 and later; elsewhere the same shapes load through pointers)."""
    if device.type == "cpu":
        return INTERPRETER_CONFIG
    nearest = nearest_gpu_config(head_dim)
    if _capability(device.index if device.index is not None else torch.cuda.current_device()) >= (9, 0):
        return nearest
    return pointer_loads(nearest)


def nearest_gpu_config(head_dim: int) -> WindowConfig:
    """``GPU_CONFIGS``' entry for ``head_dim``, or for the nearest head dim (the smaller on a tie)."""
    return GPU_CONFIGS[min(GPU_CONFIGS, key=lambda d: (abs(d - head_dim), d))]


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    """A CUDA device's compute capability (asked once per device: it is on every call's path)."""
    return torch.cuda.get_device_capability(index)


def pointer_loads(cfg: WindowConfig) -> WindowConfig:
    """``cfg`` with every kernel loading through pointers instead of TMA descriptors."""
    return dataclasses.replace(cfg, **{f.name: dataclasses.replace(getattr(cfg, f.name), tma=False)
                                       for f in dataclasses.fields(cfg) if isinstance(getattr(cfg, f.name), Blocks)})


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
    def _head(X, b, h, sb, sh, TMA: tl.constexpr):
        """Head ``h`` of batch ``b`` of a (B, H, S, D) operand: its base pointer (the descriptor
        itself when loads go through TMA)."""
        if TMA:
            return X
        else:
            return X + b * sb + h * sh

    @triton.jit
    def _block(X, Xh, row0, start, stride, offs_d, S, BLOCK: tl.constexpr, TMA: tl.constexpr):
        """Rows ``start .. start + BLOCK`` of one head's (S, D) matrix.

        TMA: ``X`` is a descriptor over all heads' rows, ``row0`` this head's first row; rows
        past S then hold the next head's (or zeros past the tensor): every caller masks them.
        Else ``Xh`` points at the head and rows past S read as 0."""
        if TMA:
            return X.load([row0 + start, 0])
        else:
            return _tile(Xh, start + tl.arange(0, BLOCK), stride, offs_d, S)

    @triton.jit
    def _edge(start, mid_lo, mid_hi):
        """Whether the tile at ``start`` lies on a window edge (its pairs need the mask)."""
        return (start < mid_lo) | (start >= mid_hi)

    @triton.jit
    def _scores(q, k, offs_m, offs_n, edge, S, W):
        """q @ k^T for one tile, -inf outside the window when the tile is on an edge (a branch
        around the mask only, so the loop stays one software pipeline)."""
        qk = tl.dot(q, tl.trans(k))
        if edge:
            qk = tl.where(_in_window(offs_m, offs_n, S, W), qk, float("-inf"))
        return qk

    @triton.jit
    def _query_program(HQ, GROUP):
        """This program's query block, (batch x query head) index, batch, query head, kv head."""
        bh = tl.program_id(1)
        h = bh % HQ
        return tl.program_id(0), bh, bh // HQ, h, h // GROUP

    @triton.jit
    def _kv_tiles(K, Kh, V, Vh, kv_row0, start_n, sks, svs, offs_d, S, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
        """The key and value tiles of rows ``start_n .. start_n + BLOCK_N`` of one kv head."""
        return (_block(K, Kh, kv_row0, start_n, sks, offs_d, S, BLOCK_N, TMA),
                _block(V, Vh, kv_row0, start_n, svs, offs_d, S, BLOCK_N, TMA))

    @triton.jit
    def _fwd_init(BLOCK_M: tl.constexpr, D: tl.constexpr):
        """A query block's online-softmax state before any key: (acc, running max, row sum).

        The running max starts finite: a row that has seen no key yet gets exp2(-inf - m) = 0."""
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        return tl.zeros([BLOCK_M, D], dtype=tl.float32), m_i, l_i

    @triton.jit
    def _fwd_tile(acc, m_i, l_i, q, k, v, offs_m, start_n, edge, S, W, qk_scale, BLOCK_N: tl.constexpr):
        """Online-softmax update of one query block's state with one key tile (masked on edges)."""
        qk = _scores(q, k, offs_m, start_n + tl.arange(0, BLOCK_N), edge, S, W)
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        return acc, m_new, l_i

    @triton.jit
    def _fwd_span(acc, m_i, l_i, q, K, Kh, V, Vh, kv_row0, offs_m, offs_d, lo, hi, mid_lo, mid_hi, S, W, sks, svs,
                  qk_scale, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
        """One query block's state through the key tiles of [lo, hi) (one loop: one pipeline)."""
        for start_n in range(lo, hi, BLOCK_N):
            k, v = _kv_tiles(K, Kh, V, Vh, kv_row0, start_n, sks, svs, offs_d, S, BLOCK_N, TMA)
            acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, k, v, offs_m, start_n, _edge(start_n, mid_lo, mid_hi),
                                      S, W, qk_scale, BLOCK_N)
        return acc, m_i, l_i

    @triton.jit
    def _fwd_store(O, LSE, acc, m_i, l_i, b, h, bh, offs_m, offs_d, S, sob, soh, sos):
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        _store_tile(O + b * sob + h * soh, offs_m, sos, offs_d, S, acc / l_safe[:, None])
        # the LSE is kept in log2 units (what the backward needs); the wrapper converts for callers
        tl.store(LSE + bh * S + offs_m, m_i + tl.log2(l_safe), mask=offs_m < S)

    @triton.jit
    def _fwd(Q, K, V, O, LSE, sm_scale, S, W, GROUP, HQ, HKV,
             sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
             D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
        start_m, bh, b, h, hk = _query_program(HQ, GROUP)
        kv_row0 = (b * HKV + hk) * S
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        q = _block(Q, _head(Q, b, h, sqb, sqh, TMA), bh * S, start_m * BLOCK_M, sqs, offs_d, S, BLOCK_M, TMA)
        Kh = _head(K, b, hk, skb, skh, TMA)
        Vh = _head(V, b, hk, svb, svh, TMA)
        acc, m_i, l_i = _fwd_init(BLOCK_M, D)
        qk_scale = sm_scale * 1.4426950408889634
        lo, mid_lo, mid_hi, hi = _key_spans(start_m, S, W, BLOCK_M, BLOCK_N)
        acc, m_i, l_i = _fwd_span(acc, m_i, l_i, q, K, Kh, V, Vh, kv_row0, offs_m, offs_d, lo, hi, mid_lo, mid_hi,
                                  S, W, sks, svs, qk_scale, BLOCK_N, TMA)
        _fwd_store(O, LSE, acc, m_i, l_i, b, h, bh, offs_m, offs_d, S, sob, soh, sos)

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
    def _first_key_block(start_m, W, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """Index of the first key block query block ``start_m`` reaches (slot 0 of its dS row)."""
        return tl.maximum(start_m * BLOCK_M - W + 1, 0) // BLOCK_N

    @triton.jit
    def _ds_tile_base(DS, bh, start_m, slot, NQB, NSLOT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """Where the (BLOCK_M x BLOCK_N) dS tile of query block ``start_m``, slot ``slot`` starts."""
        return DS + ((bh * NQB + start_m).to(tl.int64) * NSLOT + slot) * (BLOCK_M * BLOCK_N)

    @triton.jit
    def _ds_tile_offsets(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KEY_MAJOR: tl.constexpr):
        """Element offsets inside one stored dS tile, as the tile is held: (query, key) row-major,
        or (key, query) row-major (``KEY_MAJOR``, the transposed dK/dV kernel's dS^T)."""
        if KEY_MAJOR:
            return tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        else:
            return tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]

    @triton.jit
    def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, DS, sm_scale, S, W, GROUP, HQ, HKV, NQB, NSLOT,
                  sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds,
                  D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STORE_DS: tl.constexpr,
                  TMA: tl.constexpr, TRANSPOSED: tl.constexpr = False):
        start_n = tl.program_id(0)
        bhk = tl.program_id(1)
        b = bhk // HKV
        hk = bhk % HKV
        offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, D)
        k = _block(K, _head(K, b, hk, skb, skh, TMA), bhk * S, start_n * BLOCK_N, sks, offs_d, S, BLOCK_N, TMA)
        v = _block(V, _head(V, b, hk, svb, svh, TMA), bhk * S, start_n * BLOCK_N, svs, offs_d, S, BLOCK_N, TMA)
        dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        lo, mid_lo, mid_hi, hi = _query_spans(start_n, S, W, BLOCK_M, BLOCK_N)
        offs_ds = _ds_tile_offsets(BLOCK_M, BLOCK_N, TRANSPOSED)
        # one loop over (query head of the group, query tile): one software pipeline for all of them
        n_tiles = tl.cdiv(hi - lo, BLOCK_M)
        for t in range(0, GROUP * n_tiles):
            g = t // n_tiles
            start_m = lo + (t - g * n_tiles) * BLOCK_M
            h = hk * GROUP + g
            bh = b * HQ + h
            offs_m = start_m + tl.arange(0, BLOCK_M)
            q = _block(Q, _head(Q, b, h, sqb, sqh, TMA), bh * S, start_m, sqs, offs_d, S, BLOCK_M, TMA)
            do = _block(DO, _head(DO, b, h, sdb, sdh, TMA), bh * S, start_m, sds, offs_d, S, BLOCK_M, TMA)
            lse2 = tl.load(LSE + bh * S + offs_m, mask=offs_m < S, other=0.0)
            delta = tl.load(DELTA + bh * S + offs_m, mask=offs_m < S, other=0.0)
            if TRANSPOSED:  # keys x queries: P^T and dS^T are the products' left operands as they are
                qk_t = tl.dot(k, tl.trans(q))
                if _edge(start_m, mid_lo, mid_hi):
                    qk_t = tl.where(tl.trans(_in_window(offs_m, offs_n, S, W)), qk_t, float("-inf"))
                p_t = tl.exp2(qk_t * qk_scale - lse2[None, :])
                dv = tl.dot(p_t.to(do.dtype), do, dv)
                ds = (p_t * (tl.dot(v, tl.trans(do)) - delta[None, :])).to(q.dtype)  # dS^T
                dk = tl.dot(ds, q, dk)
            else:
                qk = _scores(q, k, offs_m, offs_n, _edge(start_m, mid_lo, mid_hi), S, W)
                p = tl.exp2(qk * qk_scale - lse2[:, None])
                dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv)
                ds = (p * (tl.dot(do, tl.trans(v)) - delta[:, None])).to(q.dtype)
                dk = tl.dot(tl.trans(ds), q, dk)
            if STORE_DS:  # for the dQ kernel (one matrix product per tile); dS^T when TRANSPOSED
                qb = start_m // BLOCK_M
                slot = start_n - _first_key_block(qb, W, BLOCK_M, BLOCK_N)
                tl.store(_ds_tile_base(DS, bh, qb, slot, NQB, NSLOT, BLOCK_M, BLOCK_N) + offs_ds, ds)
        _store_tile(DK + b * skb + hk * skh, offs_n, sks, offs_d, S, dk * sm_scale)
        _store_tile(DV + b * svb + hk * svh, offs_n, svs, offs_d, S, dv)

    @triton.jit
    def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, S, W, GROUP, HQ, HKV,
                sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds,
                D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
        """dQ recomputing the probabilities (three matrix products per tile; no extra memory)."""
        start_m, bh, b, h, hk = _query_program(HQ, GROUP)
        kv_row0 = (b * HKV + hk) * S
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        q = _block(Q, _head(Q, b, h, sqb, sqh, TMA), bh * S, start_m * BLOCK_M, sqs, offs_d, S, BLOCK_M, TMA)
        do = _block(DO, _head(DO, b, h, sdb, sdh, TMA), bh * S, start_m * BLOCK_M, sds, offs_d, S, BLOCK_M, TMA)
        lse2 = tl.load(LSE + bh * S + offs_m, mask=offs_m < S, other=0.0)
        delta = tl.load(DELTA + bh * S + offs_m, mask=offs_m < S, other=0.0)
        Kh = _head(K, b, hk, skb, skh, TMA)
        Vh = _head(V, b, hk, svb, svh, TMA)
        dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        lo, mid_lo, mid_hi, hi = _key_spans(start_m, S, W, BLOCK_M, BLOCK_N)
        for start_n in range(lo, hi, BLOCK_N):
            k, v = _kv_tiles(K, Kh, V, Vh, kv_row0, start_n, sks, svs, offs_d, S, BLOCK_N, TMA)
            qk = _scores(q, k, offs_m, start_n + tl.arange(0, BLOCK_N), _edge(start_n, mid_lo, mid_hi), S, W)
            p = tl.exp2(qk * qk_scale - lse2[:, None])
            ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
            dq = tl.dot(ds.to(k.dtype), k, dq)
        _store_tile(DQ + b * sqb + h * sqh, offs_m, sqs, offs_d, S, dq * sm_scale)

    @triton.jit
    def _bwd_dq_from_ds(K, DS, DQ, sm_scale, S, W, GROUP, HQ, HKV, NQB, NSLOT,
                        sqb, sqh, sqs, skb, skh, sks,
                        D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
                        DS_T: tl.constexpr = False):
        """dQ from the dS tiles the dK/dV kernel stored (one matrix product per tile; ``DS_T``:
        the tiles are key-major, as the transposed dK/dV kernel stores them)."""
        start_m, bh, b, h, hk = _query_program(HQ, GROUP)
        _dq_block(K, _head(K, b, hk, skb, skh, TMA), DS, DQ, sm_scale, start_m, bh, b, h, hk, S, W, HKV, NQB, NSLOT,
                  sqb, sqh, sqs, sks, D, BLOCK_M, BLOCK_N, TMA, DS_T)

    @triton.jit
    def _dq_block(K, Kh, DS, DQ, sm_scale, start_m, bh, b, h, hk, S, W, HKV, NQB, NSLOT, sqb, sqh, sqs, sks,
                  D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
                  DS_T: tl.constexpr):
        """dQ of query block ``start_m`` of query head ``bh`` from its stored dS tiles, summed in
        slot order."""
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        offs_tile = _ds_tile_offsets(BLOCK_M, BLOCK_N, DS_T)
        dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        lo, _mid_lo, _mid_hi, hi = _key_spans(start_m, S, W, BLOCK_M, BLOCK_N)
        row = _ds_tile_base(DS, bh, start_m, 0, NQB, NSLOT, BLOCK_M, BLOCK_N)
        for start_n in range(lo, hi, BLOCK_N):
            # rows past S: zeros (pointer loads) or another head's keys, multiplied by dS = 0 either way
            k = _block(K, Kh, (b * HKV + hk) * S, start_n, sks, offs_d, S, BLOCK_N, TMA)
            tile = row + ((start_n - lo) // BLOCK_N) * (BLOCK_M * BLOCK_N) + offs_tile
            ds = tl.load(tile)
            if DS_T:
                ds = tl.trans(ds)
            dq = tl.dot(ds, k, dq)
        _store_tile(DQ + b * sqb + h * sqh, offs_m, sqs, offs_d, S, dq * sm_scale)


if triton is not None:
    #: each kernel's launcher: past a first launch, later ones of the same specialization skip
    #: Triton's argument binding (``kernels/triton_launch.py``)
    _LAUNCH = {kernel.__name__: Launcher(kernel)
               for kernel in (_fwd, _bwd_delta, _bwd_dkdv, _bwd_dq, _bwd_dq_from_ds)}


def _qkv_strides(*tensors: Tensor) -> tuple[int, ...]:
    return tuple(s for t in tensors for s in t.stride()[:3])


def _operand(t: Tensor, rows: int, tma: bool) -> object:
    """A (B, H, S, D) operand as a kernel takes it: the tensor, or a TMA descriptor over all its
    rows (B*H*S of them) that loads ``rows`` x D tiles."""
    if not tma:
        return t
    if not t.is_contiguous():
        raise AttentionInputError(f"TMA loads need a contiguous (B, H, S, D) operand, got strides {tuple(t.stride())}")
    return TensorDescriptor.from_tensor(t.view(-1, t.shape[-1]), [rows, t.shape[-1]])


def launch_forward(q: Tensor, k: Tensor, v: Tensor, window: int, scale: float, blocks: Blocks
                   ) -> tuple[Tensor, Tensor]:
    """Run the forward kernel: ``(out, lse2)`` with the LSE in log2 units (float32)."""
    bsz, hq, s, d = q.shape
    o = torch.empty_like(q)
    lse2 = torch.empty((bsz, hq, s), device=q.device, dtype=torch.float32)
    bm, bn, tma = blocks.block_m, blocks.block_n, blocks.tma
    _LAUNCH["_fwd"]((triton.cdiv(s, bm), bsz * hq), _operand(q, bm, tma), _operand(k, bn, tma), _operand(v, bn, tma), o, lse2, scale, s, window,
               hq // k.shape[1], hq, k.shape[1], *_qkv_strides(q, k, v, o), D=d, BLOCK_M=bm, BLOCK_N=bn, TMA=tma,
               num_warps=blocks.warps, num_stages=blocks.stages)
    return o, lse2


def launch_delta(o: Tensor, do: Tensor, blocks: Blocks) -> Tensor:
    """rowsum(O · dO), float32, (B, Hq, S)."""
    bsz, hq, s, d = o.shape
    delta = torch.empty((bsz, hq, s), device=o.device, dtype=torch.float32)
    _LAUNCH["_bwd_delta"]((triton.cdiv(s, blocks.block_m), bsz * hq),
        o, do, delta, s, hq, *_qkv_strides(o, do), D=d, BLOCK_M=blocks.block_m, num_warps=blocks.warps)
    return delta


@functools.lru_cache(maxsize=256)
def ds_layout(s: int, window: int, blocks: Blocks) -> tuple[int, int]:
    """``(query blocks, slots per query block)`` of the dS buffer for dK/dV tiles ``blocks``.

    Slot ``j - first(i)`` of query block ``i`` holds the (block_m x block_n) tile of key block
    ``j``, where ``first(i)`` is the first key block the window of query block ``i`` reaches."""
    bm, bn = blocks.block_m, blocks.block_n
    nqb = -(-s // bm)
    # the largest number of key blocks one query block reaches: its key range [m0 - W + 1, m0 + bm)
    # (clipped at 0 and S) starts at m0 - W + 1, whose offset inside a key block repeats with
    # period bn / gcd(bm, bn) in the query block index
    slots = 0
    for i in {*range(min(nqb, bn // math.gcd(bm, bn) + -(-window // bm) + 1)), nqb - 1}:
        m0 = i * bm
        first, last = max(m0 - window + 1, 0) // bn, (min(m0 + bm, s) - 1) // bn
        slots = max(slots, last - first + 1)
    return nqb, slots


def ds_bytes(q: Tensor, window: int, blocks: Blocks) -> int:
    """Bytes of the dS buffer the backward would hold for ``q`` (its dtype, all query heads)."""
    nqb, slots = ds_layout(q.shape[2], window, blocks)
    return q.shape[0] * q.shape[1] * nqb * slots * blocks.block_m * blocks.block_n * q.element_size()


def launch_dkdv(q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse2: Tensor, delta: Tensor, window: int,
                scale: float, blocks: Blocks, *, store_ds: bool = False,
                transposed: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """Run the dK/dV kernel (one program per key block and kv head): ``(dk, dv, ds)``.

    ``delta`` is :func:`launch_delta`'s output. With ``store_ds`` it also writes every tile's dS
    (the input dtype; the values the dQ product uses) into a buffer laid out by
    :func:`ds_layout`, else ``ds`` is None; ``transposed`` runs the kernel on keys x queries
    tiles (its dS tiles are then stored key-major)."""
    bsz, hq, s, d = q.shape
    hkv = k.shape[1]
    bm, bn, tma = blocks.block_m, blocks.block_n, blocks.tma
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    nqb, slots = ds_layout(s, window, blocks)
    ds = (torch.empty((bsz * hq, nqb, slots, blocks.block_m, blocks.block_n), device=q.device, dtype=q.dtype)
          if store_ds else None)
    _LAUNCH["_bwd_dkdv"]((triton.cdiv(s, bn), bsz * hkv),
        _operand(q, bm, tma), _operand(k, bn, tma), _operand(v, bn, tma), _operand(do, bm, tma), lse2, delta,
        dk, dv, ds if ds is not None else dk,
        scale, s, window, hq // hkv, hq, hkv, nqb, slots,
        *_qkv_strides(q, k, v, do), D=d, BLOCK_M=bm, BLOCK_N=bn, STORE_DS=store_ds, TMA=tma,
        TRANSPOSED=transposed, num_warps=blocks.warps, num_stages=blocks.stages)
    return dk, dv, ds


def launch_dq(q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse2: Tensor, delta: Tensor, window: int,
              scale: float, blocks: Blocks) -> Tensor:
    """Run the dQ kernel that recomputes the probabilities (one program per query block and head)."""
    bsz, hq, s, d = q.shape
    bm, bn, tma = blocks.block_m, blocks.block_n, blocks.tma
    dq = torch.empty_like(q)
    _LAUNCH["_bwd_dq"]((triton.cdiv(s, bm), bsz * hq),
        _operand(q, bm, tma), _operand(k, bn, tma), _operand(v, bn, tma), _operand(do, bm, tma), lse2, delta, dq,
        scale, s, window, hq // k.shape[1], hq, k.shape[1], *_qkv_strides(q, k, v, do), D=d, BLOCK_M=bm,
        BLOCK_N=bn, TMA=tma, num_warps=blocks.warps, num_stages=blocks.stages)
    return dq


def launch_dq_from_ds(q: Tensor, k: Tensor, ds: Tensor, window: int, scale: float, blocks: Blocks,
                      warps: int = 4, stages: int = 2, tma: bool = False, transposed: bool = False) -> Tensor:
    """dQ = dS @ K from the tiles :func:`launch_dkdv` stored with the same ``blocks`` (and the
    same ``transposed``)."""
    bsz, hq, s, d = q.shape
    nqb, slots = ds_layout(s, window, blocks)
    if tuple(ds.shape) != (bsz * hq, nqb, slots, blocks.block_m, blocks.block_n):
        raise AttentionInputError(f"dS buffer of shape {tuple(ds.shape)} was not written with blocks {blocks}")
    dq = torch.empty_like(q)
    _LAUNCH["_bwd_dq_from_ds"]((nqb, bsz * hq),
        _operand(k, blocks.block_n, tma), ds, dq, scale, s, window, hq // k.shape[1], hq, k.shape[1], nqb, slots,
        *_qkv_strides(q, k), D=d, BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, TMA=tma, DS_T=transposed,
        num_warps=warps, num_stages=stages)
    return dq


def backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse2: Tensor, do: Tensor, window: int, scale: float,
             cfg: WindowConfig) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)``: the delta, dK/dV and dQ kernels; deterministic (no atomics) either way.

    dQ comes from the dS tiles the dK/dV kernel stores when ``cfg.dq_from_ds`` is set and the
    buffer fits in ``DS_BUFFER_LIMIT_BYTES``, else from a kernel that recomputes them."""
    delta = launch_delta(o, do, cfg.dq)
    via_ds = cfg.dq_from_ds is not None and ds_bytes(q, window, cfg.dkdv) <= DS_BUFFER_LIMIT_BYTES
    dk, dv, ds = launch_dkdv(q, k, v, do, lse2, delta, window, scale, cfg.dkdv, store_ds=via_ds,
                             transposed=cfg.dkdv_transposed)
    if ds is not None and cfg.dq_from_ds is not None:
        dq = launch_dq_from_ds(q, k, ds, window, scale, cfg.dkdv, cfg.dq_from_ds.warps, cfg.dq_from_ds.stages,
                               cfg.dq_from_ds.tma, transposed=cfg.dkdv_transposed)
    else:
        dq = launch_dq(q, k, v, do, lse2, delta, window, scale, cfg.dq)
    return dq, dk, dv


def unsupported(q: Tensor, k: Tensor, v: Tensor, window: object) -> str | None:
    """``None`` if the kernel computes this problem, else why not."""
    if q.dtype not in KERNEL_DTYPES:
        # float64 fails an assertion inside Triton's compiler (its products accumulate in float32)
        return f"the sliding-window kernel takes float16, bfloat16 or float32, got {q.dtype}"
    why = available(q.device)
    if why is not None:
        return why
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        # Triton 3.6's interpreter multiplies bf16 tiles as their raw bits: outputs ~1e9, no error
        return "Triton's CPU interpreter computes bfloat16 products wrongly: use float16 or float32 on the CPU"
    largest = max(t.numel() for t in (q, k, v))
    if largest > MAX_ELEMENTS:
        # a head's base is b * stride_b + h * stride_h in 32-bit integers: past 2**31 elements it wraps
        return (f"the sliding-window kernel addresses its operands with 32-bit offsets: at most {MAX_ELEMENTS} "
                f"elements per tensor, got {largest} (split the batch)")
    d = q.shape[-1]
    if q.shape[2] != k.shape[2]:
        return f"the sliding-window kernel needs Sq == Skv, got {q.shape[2]} and {k.shape[2]}"
    if v.shape[-1] != d or d < 16 or d > 256 or d & (d - 1):
        return f"the sliding-window kernel needs one head dim, a power of two in 16..256, got q/k {d}, v {v.shape[-1]}"
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        return f"window must be a positive int, got {window!r}"
    return None
