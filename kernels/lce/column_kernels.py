"""Triton column pass: the row kernel's math on class-major logits (``[C, N]``, tokens contiguous).

The class-major driver (``class_major.py``) holds every token's logits transposed, so one
token's logits are a column. Two kernels over ``BLOCK_C x BLOCK_T`` tiles (loads coalesced
along the tokens), each on a grid of token blocks x class splits with its own launch shape:

1. partial statistics of each split's classes per token: running max, sum of exponentials
   and (for label smoothing) the class-weighted logit sum;
2. each program combines its tokens' partials into the logsumexp, the split-0 programs store
   the per-token loss terms, and every program overwrites its split's logits with
   d(loss)/d(logits) (label smoothing, class weights, z-loss, soft-cap, ignore_index, the
   per-token upstream scale), exactly as ``triton_kernels._lce_row_kernel`` does per row.

All math is float32. Works under ``TRITON_INTERPRET=1`` on CPU tensors.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .config import LossConfig
from .rowwise import RowResult
from .triton_kernels import kernel_operands, triton

if triton is not None:
    import triton.language as tl

    from .triton_kernels import _grad_coefficients, _logit_grad, _loss_terms, _stats_step, _tanh

    @triton.jit
    def _column_tile(logits_ptr, stride_c, start, c_hi, toks, t_in, BLOCK_C: tl.constexpr):
        """The ``BLOCK_C`` classes from ``start`` (up to ``c_hi``) x the program's tokens: the
        classes, their mask, the tile's mask and its addresses."""
        cols = start + tl.arange(0, BLOCK_C)
        c_in = cols < c_hi
        mask = c_in[:, None] & t_in[None, :]
        return cols, c_in, mask, logits_ptr + cols[:, None].to(tl.int64) * stride_c + toks[None, :]

    @triton.jit
    def _lce_column_stats_kernel(
        logits_ptr,
        stride_c,
        n_rows,
        n_cols,
        cols_per_split,
        class_weight_ptr,
        softcap,
        m_ptr,
        s_ptr,
        wz_ptr,
        HAS_WEIGHT: tl.constexpr,
        HAS_SMOOTH: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        split = tl.program_id(1)
        toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        t_in = toks < n_rows
        c_lo = split * cols_per_split
        c_hi = tl.minimum(c_lo + cols_per_split, n_cols)
        # running statistics per tile element, reduced over the classes once at the end (a
        # reduction across warps every tile cost more than the tile's loads)
        m_el = tl.full([BLOCK_C, BLOCK_T], float("-inf"), tl.float32)
        s_el = tl.zeros([BLOCK_C, BLOCK_T], tl.float32)
        wz_el = tl.zeros([BLOCK_C, BLOCK_T], tl.float32)
        for start in range(c_lo, c_hi, BLOCK_C):
            cols, c_in, mask, ptrs = _column_tile(logits_ptr, stride_c, start, c_hi, toks, t_in, BLOCK_C)
            z = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
            w = 0.0  # the class weights, broadcast to the tile, where weighted smoothing needs them
            if HAS_SMOOTH:
                if HAS_WEIGHT:
                    w = tl.load(class_weight_ptr + cols, mask=c_in, other=0.0)[:, None]
            m_el, s_el, wz_el = _stats_step(m_el, s_el, wz_el, z, mask, w, softcap, HAS_SMOOTH, HAS_WEIGHT,
                                            HAS_SOFTCAP)
        m = tl.max(m_el, axis=0)
        s = tl.sum(tl.where(m_el == float("-inf"), 0.0, s_el * tl.exp(m_el - m[None, :])), axis=0)
        out = split * n_rows + toks
        tl.store(m_ptr + out, m, mask=t_in)
        tl.store(s_ptr + out, s, mask=t_in)
        if HAS_SMOOTH:
            tl.store(wz_ptr + out, tl.sum(wz_el, axis=0), mask=t_in)

    @triton.jit
    def _lce_column_grad_kernel(
        logits_ptr,
        stride_c,
        target_ptr,
        class_weight_ptr,
        coefs_ptr,
        row_scale_ptr,
        m_ptr,
        s_ptr,
        wz_ptr,
        nll_ptr,
        smooth_ptr,
        lse_sq_ptr,
        n_rows,
        n_cols,
        cols_per_program,
        n_stat_splits,
        ignore_index,
        softcap,
        HAS_WEIGHT: tl.constexpr,
        HAS_SMOOTH: tl.constexpr,
        HAS_Z: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr,
        HAS_ROW_SCALE: tl.constexpr,
        WANT_GRAD: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        split = tl.program_id(1)
        toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        t_in = toks < n_rows
        big = tl.full([BLOCK_T], float("-inf"), tl.float32)
        for k in range(n_stat_splits):  # combine the statistics kernel's partials
            big = tl.maximum(big, tl.load(m_ptr + k * n_rows + toks, mask=t_in, other=float("-inf")))
        total = tl.zeros([BLOCK_T], tl.float32)
        wz = tl.zeros([BLOCK_T], tl.float32)
        for k in range(n_stat_splits):
            m_k = tl.load(m_ptr + k * n_rows + toks, mask=t_in, other=float("-inf"))
            s_k = tl.load(s_ptr + k * n_rows + toks, mask=t_in, other=0.0)
            total += tl.where(m_k == float("-inf"), 0.0, s_k * tl.exp(m_k - big))
            if HAS_SMOOTH:
                wz += tl.load(wz_ptr + k * n_rows + toks, mask=t_in, other=0.0)
        lse = big + tl.log(total)

        y = tl.load(target_ptr + toks, mask=t_in, other=ignore_index).to(tl.int64)
        valid = (y != ignore_index) & t_in
        in_range = (y >= 0) & (y < n_cols)
        y_safe = tl.where(valid & in_range, y, 0)
        z_y = tl.load(logits_ptr + y_safe * stride_c + toks, mask=t_in, other=0.0).to(tl.float32)
        if HAS_SOFTCAP:
            z_y = softcap * _tanh(z_y / softcap)
        if HAS_WEIGHT:
            w_y = tl.load(class_weight_ptr + y_safe, mask=t_in, other=0.0)
        else:
            w_y = tl.full([BLOCK_T], 1.0, tl.float32)
        w_sum = tl.load(coefs_ptr + 3)
        if split == 0:
            nll, smooth, lse_sq = _loss_terms(lse, z_y, w_y, wz, w_sum, valid, in_range, HAS_SMOOTH, HAS_Z)
            tl.store(nll_ptr + toks, nll, mask=t_in)
            tl.store(smooth_ptr + toks, smooth, mask=t_in)
            tl.store(lse_sq_ptr + toks, lse_sq, mask=t_in)

        if WANT_GRAD:
            nll_coef, row_coef, a_sm = _grad_coefficients(coefs_ptr, w_y, w_sum, lse, HAS_SMOOTH, HAS_Z)
            if HAS_ROW_SCALE:
                g = tl.load(row_scale_ptr + toks, mask=t_in, other=0.0).to(tl.float32)
            else:
                g = tl.full([BLOCK_T], 1.0, tl.float32)
            g = tl.where(valid, g, 0.0)
            c_lo = split * cols_per_program
            c_hi = tl.minimum(c_lo + cols_per_program, n_cols)
            for start in range(c_lo, c_hi, BLOCK_C):
                cols, c_in, mask, ptrs = _column_tile(logits_ptr, stride_c, start, c_hi, toks, t_in, BLOCK_C)
                z = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
                w = 0.0
                if HAS_SMOOTH:
                    if HAS_WEIGHT:
                        w = tl.load(class_weight_ptr + cols, mask=c_in, other=0.0)[:, None]
                d = _logit_grad(z, lse[None, :], row_coef[None, :], nll_coef[None, :],
                                cols[:, None] == y_safe[None, :], a_sm, w, softcap, HAS_SMOOTH, HAS_WEIGHT,
                                HAS_SOFTCAP)
                tl.store(ptrs, (d * g[None, :]).to(logits_ptr.dtype.element_ty), mask=mask)


class ColumnTiles(NamedTuple):
    """One column kernel's launch shape: tokens and classes per tile, warps, and the programs
    per streaming multiprocessor its class splits aim for."""

    block_t: int
    block_c: int
    warps: int
    per_sm: int


#: over 4096 x 128256 bf16 logits on an H200 (``benchmarks/lce_bench.py --class-major``) the
#: statistics pass takes 0.426 ms at this shape (0.440-0.575 at the other shapes measured) ...
STATS_TILES = ColumnTiles(64, 16, 4, 32)
#: ... and both passes 0.989 ms with the gradient pass at this shape (1.008-1.202 at the others)
GRAD_TILES = ColumnTiles(256, 16, 8, 8)


def column_splits(n_rows: int, n_cols: int, tiles: ColumnTiles, device: torch.device) -> tuple[int, int]:
    """``(cols_per_program, n_splits)``: split the classes so the grid has about ``tiles.per_sm``
    programs per SM (every split non-empty, a multiple of ``tiles.block_c`` wide)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    token_blocks = triton.cdiv(max(n_rows, 1), tiles.block_t)
    want = max(1, min(triton.cdiv(tiles.per_sm * sms, token_blocks), triton.cdiv(n_cols, tiles.block_c)))
    cols = triton.cdiv(triton.cdiv(n_cols, want), tiles.block_c) * tiles.block_c
    return cols, triton.cdiv(n_cols, cols)


def triton_column_pass(
    logits_t: torch.Tensor,
    target: torch.Tensor,
    cfg: LossConfig,
    class_weight: torch.Tensor | None,
    coefs: torch.Tensor,
    row_scale: torch.Tensor | None,
    want_grad: bool,
    *,
    tiles: tuple[ColumnTiles, ColumnTiles] | None = None,
) -> RowResult:
    """:func:`triton_kernels.triton_row_pass` on class-major logits ``logits_t`` (``[C, N]``,
    contiguous along the tokens); the gradient (``[C, N]``) overwrites ``logits_t``.

    ``tiles`` overrides the (statistics, gradient) kernels' launch shapes (for tuning)."""
    n_cols, n = logits_t.shape
    ops = kernel_operands(n, logits_t.device, cfg, class_weight, coefs, row_scale)
    nll, smooth, lse_sq = ops.nll, ops.smooth, ops.lse_sq
    if logits_t.stride(1) != 1:
        raise ValueError("class-major logits must be contiguous along the tokens")
    if n == 0:
        return RowResult(nll, smooth, lse_sq, logits_t if want_grad else None)
    stats_tiles, grad_tiles = tiles or (STATS_TILES, GRAD_TILES)
    stat_cols, stat_splits = column_splits(n, n_cols, stats_tiles, logits_t.device)
    grad_cols, grad_splits = column_splits(n, n_cols, grad_tiles, logits_t.device)
    m = torch.empty((stat_splits, n), dtype=torch.float32, device=logits_t.device)
    s = torch.empty_like(m)
    wz = torch.empty_like(m) if ops.features["HAS_SMOOTH"] else m
    stats_features = {k: ops.features[k] for k in ("HAS_WEIGHT", "HAS_SMOOTH", "HAS_SOFTCAP")}
    _lce_column_stats_kernel[(triton.cdiv(n, stats_tiles.block_t), stat_splits)](
        logits_t, logits_t.stride(0), n, n_cols, stat_cols, ops.class_weight, ops.softcap, m, s, wz,
        **stats_features, BLOCK_T=stats_tiles.block_t, BLOCK_C=stats_tiles.block_c, num_warps=stats_tiles.warps,
    )
    _lce_column_grad_kernel[(triton.cdiv(n, grad_tiles.block_t), grad_splits if want_grad else 1)](
        logits_t, logits_t.stride(0), target, ops.class_weight, ops.coefs, ops.row_scale, m, s, wz,
        nll, smooth, lse_sq, n, n_cols, grad_cols, stat_splits, cfg.ignore_index, ops.softcap,
        **ops.features, WANT_GRAD=want_grad,
        BLOCK_T=grad_tiles.block_t, BLOCK_C=grad_tiles.block_c, num_warps=grad_tiles.warps,
    )
    return RowResult(nll, smooth, lse_sq, logits_t if want_grad else None)
    stats_tiles, grad_tiles = tiles or (STATS_TILES, GRAD_TILES)
    stat_cols, stat_splits = column_splits(n, n_cols, stats_tiles, logits_t.device)
    grad_cols, grad_splits = column_splits(n, n_cols, grad_tiles, logits_t.device)
    m = torch.empty((stat_splits, n), dtype=ct, device=logits_t.device)
    s = torch.empty_like(m)
    has_smooth = cfg.label_smoothing > 0.0
    wz = torch.empty_like(m) if has_smooth else m
    cw = class_weight.to(ct).contiguous() if class_weight is not None else coefs
    rs = row_scale.contiguous() if row_scale is not None else coefs
    cap = float(cfg.softcap) if cfg.softcap is not None else 1.0
    flags = dict(HAS_WEIGHT=class_weight is not None, HAS_SMOOTH=has_smooth, HAS_SOFTCAP=cfg.softcap is not None)
    _lce_column_stats_kernel[(triton.cdiv(n, stats_tiles.block_t), stat_splits)](
        logits_t, logits_t.stride(0), n, n_cols, stat_cols, cw, cap, m, s, wz, **flags,
        BLOCK_T=stats_tiles.block_t, BLOCK_C=stats_tiles.block_c, num_warps=stats_tiles.warps,
    )
    _lce_column_grad_kernel[(triton.cdiv(n, grad_tiles.block_t), grad_splits if want_grad else 1)](
        logits_t, logits_t.stride(0), target, cw, coefs.to(ct), rs, m, s, wz, nll, smooth, lse_sq,
        n, n_cols, grad_cols, stat_splits, cfg.ignore_index, cap, **flags,
        HAS_Z=cfg.z_loss > 0.0, HAS_ROW_SCALE=row_scale is not None, WANT_GRAD=want_grad,
        BLOCK_T=grad_tiles.block_t, BLOCK_C=grad_tiles.block_c, num_warps=grad_tiles.warps,
    )
    return RowResult(nll, smooth, lse_sq, logits_t if want_grad else None)
