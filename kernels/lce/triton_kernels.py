"""Triton row kernel: loss terms and, in place, logit gradients of one chunk of logits.

One program per row makes two sweeps over the row's logits in ``BLOCK``-wide tiles: the
first computes the row's logsumexp online (and the class-weighted logit sum used by label
smoothing), the second overwrites the logits with d(loss)/d(logits). All math is float32
whatever the logits' dtype (bf16, fp16 or fp32). Works under ``TRITON_INTERPRET=1`` on CPU
tensors, which is how it is checked without a GPU.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch

from .config import LossConfig
from .rowwise import RowResult

try:  # Triton is optional: CPU-only installs of torch do not ship it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None
    tl = None


def triton_importable() -> bool:
    """Whether the ``triton`` package can be imported."""
    return triton is not None


def triton_usable(device: torch.device) -> bool:
    """Whether the Triton row kernel can run on tensors of ``device``."""
    if triton is None:
        return False
    if device.type == "cuda":
        return True
    return os.environ.get("TRITON_INTERPRET") == "1" and device.type == "cpu"


if triton is not None:

    @triton.jit
    def _tanh(x):
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        return tl.where(x < 0, -t, t)

    @triton.jit
    def _online_lse_step(m, s, z, mask):
        """One element per lane of a running logsumexp (``m`` the max, ``s`` the sum of
        ``exp(z - m)``) with one exponential: ``exp(-|z - m|)`` either rescales the old sum (a
        new max) or is the new term. Masked lanes keep their state."""
        e = tl.exp(-tl.abs(z - m))  # NaN only where z and m are both -inf: such lanes are masked or keep m
        bigger = z > m
        s_new = tl.where(bigger, s * e + 1.0, s + e)
        return tl.where(mask & bigger, z, m), tl.where(mask, s_new, s)

    @triton.jit
    def _stats_step(m, s, wz, z, mask, w, softcap, HAS_SMOOTH: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                    HAS_SOFTCAP: tl.constexpr):
        """The first sweep's step over one tile of raw logits ``z`` (``w``: the tile's class
        weights, broadcast to it, when weighted smoothing needs them): the soft-cap, the
        class-weighted logit sum of label smoothing, and the running logsumexp."""
        if HAS_SOFTCAP:
            z = softcap * _tanh(z / softcap)
        if HAS_SMOOTH:
            if HAS_WEIGHT:
                wz += tl.where(mask, w * z, 0.0)
            else:
                wz += tl.where(mask, z, 0.0)
        m, s = _online_lse_step(m, s, z, mask)
        return m, s, wz

    @triton.jit
    def _loss_terms(lse, z_y, w_y, wz, w_sum, valid, in_range, HAS_SMOOTH: tl.constexpr, HAS_Z: tl.constexpr):
        """Per row: ``w[y] * (lse - z[y])`` (NaN for a target out of range), the smoothing term
        ``sum_c w[c] * lse - sum_c w[c] * z[c]`` and ``lse**2``; zeros where ignored or unused."""
        nll = tl.where(valid, w_y * (lse - z_y), 0.0)
        nll = tl.where(valid & (~in_range), float("nan"), nll)
        if HAS_SMOOTH:
            smooth = tl.where(valid, w_sum * lse - wz, 0.0)
        else:
            smooth = lse * 0.0
        if HAS_Z:
            lse_sq = tl.where(valid, lse * lse, 0.0)
        else:
            lse_sq = lse * 0.0
        return nll, smooth, lse_sq

    @triton.jit
    def _grad_coefficients(coefs_ptr, w_y, w_sum, lse, HAS_SMOOTH: tl.constexpr, HAS_Z: tl.constexpr):
        """Per row: the target's coefficient ``a_nll * w[y]``, the factor on ``softmax(z)``
        (the nll, smoothing and z-loss terms') and the smoothing's per-class coefficient."""
        nll_coef = tl.load(coefs_ptr + 0) * w_y
        row_coef = nll_coef
        a_sm = tl.load(coefs_ptr + 1)
        if HAS_SMOOTH:
            row_coef += a_sm * w_sum
        if HAS_Z:
            row_coef += 2.0 * tl.load(coefs_ptr + 2) * lse
        return nll_coef, row_coef, a_sm

    @triton.jit
    def _logit_grad(z, lse, row_coef, nll_coef, is_target, a_sm, w, softcap, HAS_SMOOTH: tl.constexpr,
                    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
        """d(loss)/d(raw logit) of one tile before the row's upstream scale (every operand
        broadcast to the tile; ``w`` as in :func:`_stats_step`)."""
        if HAS_SOFTCAP:
            t = _tanh(z / softcap)
            z = softcap * t
        d = tl.exp(z - lse) * row_coef
        d = tl.where(is_target, d - nll_coef, d)
        if HAS_SMOOTH:
            if HAS_WEIGHT:
                d -= a_sm * w
            else:
                d -= a_sm
        if HAS_SOFTCAP:
            d *= 1.0 - t * t
        return d

    @triton.jit
    def _lce_row_kernel(
        logits_ptr,
        stride_row,
        target_ptr,
        class_weight_ptr,
        coefs_ptr,
        row_scale_ptr,
        nll_ptr,
        smooth_ptr,
        lse_sq_ptr,
        n_cols,
        ignore_index,
        softcap,
        HAS_WEIGHT: tl.constexpr,
        HAS_SMOOTH: tl.constexpr,
        HAS_Z: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr,
        HAS_ROW_SCALE: tl.constexpr,
        WANT_GRAD: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride_row
        y = tl.load(target_ptr + row).to(tl.int64)
        valid = y != ignore_index
        in_range = (y >= 0) & (y < n_cols)
        y_safe = tl.where(valid & in_range, y, 0)
        offs = tl.arange(0, BLOCK)

        m_vec = tl.full([BLOCK], float("-inf"), tl.float32)
        s_vec = tl.zeros([BLOCK], tl.float32)
        wz_vec = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + offs
            mask = cols < n_cols
            z = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
            w = 0.0  # the class weights' tile, where weighted label smoothing needs it
            if HAS_SMOOTH:
                if HAS_WEIGHT:
                    w = tl.load(class_weight_ptr + cols, mask=mask, other=0.0)
            m_vec, s_vec, wz_vec = _stats_step(m_vec, s_vec, wz_vec, z, mask, w, softcap, HAS_SMOOTH, HAS_WEIGHT,
                                               HAS_SOFTCAP)
        m = tl.max(m_vec, axis=0)
        s = tl.sum(tl.where(m_vec == float("-inf"), 0.0, s_vec * tl.exp(m_vec - m)), axis=0)
        lse = m + tl.log(s)

        z_y = tl.load(base + y_safe).to(tl.float32)
        if HAS_SOFTCAP:
            z_y = softcap * _tanh(z_y / softcap)
        if HAS_WEIGHT:
            w_y = tl.load(class_weight_ptr + y_safe)
        else:
            w_y = 1.0
        w_sum = tl.load(coefs_ptr + 3)
        nll, smooth, lse_sq = _loss_terms(lse, z_y, w_y, tl.sum(wz_vec, axis=0), w_sum, valid, in_range,
                                          HAS_SMOOTH, HAS_Z)
        tl.store(nll_ptr + row, nll)
        tl.store(smooth_ptr + row, smooth)
        tl.store(lse_sq_ptr + row, lse_sq)

        if WANT_GRAD:
            nll_coef, row_coef, a_sm = _grad_coefficients(coefs_ptr, w_y, w_sum, lse, HAS_SMOOTH, HAS_Z)
            if HAS_ROW_SCALE:
                g = tl.load(row_scale_ptr + row).to(tl.float32)
            else:
                g = 1.0
            for start in range(0, n_cols, BLOCK):
                cols = start + offs
                mask = cols < n_cols
                z = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
                w = 0.0
                if HAS_SMOOTH:
                    if HAS_WEIGHT:
                        w = tl.load(class_weight_ptr + cols, mask=mask, other=0.0)
                d = _logit_grad(z, lse, row_coef, nll_coef, cols == y_safe, a_sm, w, softcap, HAS_SMOOTH,
                                HAS_WEIGHT, HAS_SOFTCAP)
                d = tl.where(valid, d * g, 0.0)
                tl.store(base + cols, d.to(logits_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _scale_unless_one_kernel(ptr, scale_ptr, n, BLOCK: tl.constexpr, HALF: tl.constexpr):
        scale = tl.load(scale_ptr)  # already in the tensor's dtype
        if scale != 1.0:  # decided on the device: no host synchronisation, no traffic when 1
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            inside = offs < n
            x = tl.load(ptr + offs, mask=inside)
            if HALF:  # bf16/fp16: multiply in float32 and round once, as torch does
                y = (x.to(tl.float32) * scale.to(tl.float32)).to(ptr.dtype.element_ty)
            else:  # float32/float64: in the tensor's own precision
                y = x * scale
            tl.store(ptr + offs, y, mask=inside)


def triton_scale_(t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``t *= scale`` in place (``t`` contiguous, ``scale`` a one-element tensor on its device),
    rounding as ``t.mul_(scale.to(t.dtype))`` does; nothing is read or written when scale is 1
    (the usual upstream gradient of a scalar loss)."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    if not t.is_contiguous() or scale.numel() != 1 or scale.device != t.device:
        raise ValueError("triton_scale_ needs a contiguous tensor and a one-element scale on its device")
    if t.numel():
        block = 8192
        half = t.dtype in (torch.bfloat16, torch.float16)
        _scale_unless_one_kernel[(triton.cdiv(t.numel(), block),)](t, scale.to(t.dtype), t.numel(), BLOCK=block,
                                                                  HALF=half, num_warps=8)
    return t


def _launch_config(n_cols: int) -> tuple[int, int]:
    block = min(triton.next_power_of_2(max(n_cols, 16)), 8192)
    # 32 warps on 8192-wide tiles: 0.273 ms vs 0.318 ms with 16 for a 1024 x 128256 bf16 chunk
    # (H200, benchmarks/lce_bench.py --sweep)
    warps = 32 if block >= 8192 else 8 if block >= 2048 else 4
    return block, warps


class KernelOperands(NamedTuple):
    """What the row and column passes hand their kernels besides the logits: per-row outputs,
    the class weights, coefficients and per-row scale (an unused pointer's stand-in where a
    feature is off), the soft-cap and the feature flags (constexprs)."""

    nll: torch.Tensor
    smooth: torch.Tensor
    lse_sq: torch.Tensor
    class_weight: torch.Tensor
    coefs: torch.Tensor
    row_scale: torch.Tensor
    softcap: float
    features: dict[str, bool]


def kernel_operands(n: int, device: torch.device, cfg: LossConfig, class_weight: torch.Tensor | None,
                    coefs: torch.Tensor, row_scale: torch.Tensor | None) -> KernelOperands:
    """The float32 per-row outputs of ``n`` rows and the kernels' other operands."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    ct = torch.float32
    nll = torch.empty(n, dtype=ct, device=device)
    features = dict(HAS_WEIGHT=class_weight is not None, HAS_SMOOTH=cfg.label_smoothing > 0.0, HAS_Z=cfg.z_loss > 0.0,
                    HAS_SOFTCAP=cfg.softcap is not None, HAS_ROW_SCALE=row_scale is not None)
    return KernelOperands(
        nll, torch.empty_like(nll), torch.empty_like(nll),
        class_weight.to(ct).contiguous() if class_weight is not None else coefs,
        coefs.to(ct),
        row_scale.contiguous() if row_scale is not None else coefs,
        float(cfg.softcap) if cfg.softcap is not None else 1.0,
        features,
    )


def triton_row_pass(
    logits: torch.Tensor,
    target: torch.Tensor,
    cfg: LossConfig,
    class_weight: torch.Tensor | None,
    coefs: torch.Tensor,
    row_scale: torch.Tensor | None,
    want_grad: bool,
    *,
    block: int | None = None,
    num_warps: int | None = None,
) -> RowResult:
    """Same contract as :func:`rowwise.torch_row_pass`; the gradient overwrites ``logits``.

    ``block``/``num_warps`` override the launch configuration (for tuning).
    """
    n, n_cols = logits.shape
    ops = kernel_operands(n, logits.device, cfg, class_weight, coefs, row_scale)
    nll, smooth, lse_sq = ops.nll, ops.smooth, ops.lse_sq
    if n == 0:
        return RowResult(nll, smooth, lse_sq, logits if want_grad else None)
    if logits.stride(1) != 1:
        raise ValueError("logits must be contiguous along the class dimension")
    default_block, default_warps = _launch_config(n_cols)
    _lce_row_kernel[(n,)](
        logits, logits.stride(0), target, ops.class_weight, ops.coefs, ops.row_scale, nll, smooth, lse_sq,
        n_cols, cfg.ignore_index, ops.softcap, **ops.features, WANT_GRAD=want_grad,
        BLOCK=block or default_block, num_warps=num_warps or default_warps,
    )
    return RowResult(nll, smooth, lse_sq, logits if want_grad else None)
    if logits.stride(1) != 1:
        raise ValueError("logits must be contiguous along the class dimension")
    default_block, default_warps = _launch_config(n_cols)
    block = block or default_block
    warps = num_warps or default_warps
    cw = class_weight.to(ct).contiguous() if class_weight is not None else coefs
    rs = row_scale.contiguous() if row_scale is not None else coefs
    _lce_row_kernel[(n,)](
        logits,
        logits.stride(0),
        target,
        cw,
        coefs.to(ct),
        rs,
        nll,
        smooth,
        lse_sq,
        n_cols,
        cfg.ignore_index,
        float(cfg.softcap) if cfg.softcap is not None else 1.0,
        HAS_WEIGHT=class_weight is not None,
        HAS_SMOOTH=cfg.label_smoothing > 0.0,
        HAS_Z=cfg.z_loss > 0.0,
        HAS_SOFTCAP=cfg.softcap is not None,
        HAS_ROW_SCALE=row_scale is not None,
        WANT_GRAD=want_grad,
        BLOCK=block,
        num_warps=warps,
    )
    return RowResult(nll, smooth, lse_sq, logits if want_grad else None)
