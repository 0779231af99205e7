"""Portable row pass: loss terms and logit gradients of one chunk of logits, in PyTorch ops.

This is the element-wise half of the chunked algorithm (the matrix products live in
``chunked.py``); ``triton_kernels.py`` provides the same contract as one fused CUDA kernel.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from .config import LossConfig


class RowResult(NamedTuple):
    """Per-row loss terms (compute dtype) and, when asked for, the logits' gradient."""

    nll: torch.Tensor  # w[y] * (lse - z[y]); 0 for ignored rows
    smooth: torch.Tensor  # sum_c w[c] * (lse - z[c]); 0 for ignored rows (or when unused)
    lse_sq: torch.Tensor  # lse**2; 0 for ignored rows (or when unused)
    grad: torch.Tensor | None  # d(loss)/d(logits) in ``grad_dtype``, same shape as logits


class RowPass(Protocol):
    def __call__(
        self,
        logits: torch.Tensor,
        target: torch.Tensor,
        cfg: LossConfig,
        class_weight: torch.Tensor | None,
        coefs: torch.Tensor,
        row_scale: torch.Tensor | None,
        want_grad: bool,
    ) -> RowResult: ...


#: (nll, smooth, lse_sq, gradient before the soft-cap and upstream factors, or None)
_Rows = tuple[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"]


def torch_row_pass(
    logits: torch.Tensor,
    target: torch.Tensor,
    cfg: LossConfig,
    class_weight: torch.Tensor | None,
    coefs: torch.Tensor,
    row_scale: torch.Tensor | None,
    want_grad: bool,
) -> RowResult:
    """Row pass in PyTorch ops. ``logits`` (``[n, C]``) may be overwritten.

    ``coefs`` is :func:`config.reduction_coefficients`' output; ``row_scale`` is the
    upstream gradient per row (``None`` means 1). The gradient is returned in ``logits.dtype``.
    A floating-point ``target`` (``[n, C]``) holds class probabilities.
    """
    ct = coefs.dtype
    z = logits if logits.dtype == ct else logits.to(ct)
    capped_tanh = None
    if cfg.softcap is not None:
        capped_tanh = torch.tanh(z / cfg.softcap)
        z = capped_tanh * cfg.softcap
    cw = class_weight.to(ct) if class_weight is not None else None
    rows = _probability_rows if target.is_floating_point() else _index_rows
    nll, smooth, lse_sq, grad = rows(z, target, cfg, cw, coefs, want_grad)
    if grad is None:
        return RowResult(nll, smooth, lse_sq, None)
    if capped_tanh is not None:
        grad.mul_(1.0 - capped_tanh.square())
    if row_scale is not None:
        grad.mul_(row_scale.to(ct).unsqueeze(1))
    return RowResult(nll, smooth, lse_sq, grad.to(logits.dtype))


def _smoothing_and_z_terms(z: torch.Tensor, lse: torch.Tensor, cfg: LossConfig, cw: torch.Tensor | None,
                           coefs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: ``sum_c w[c] * (lse - z[c])`` (0 without label smoothing) and ``lse**2`` (0 without z-loss)."""
    if cfg.label_smoothing > 0.0:
        smooth = coefs[3] * lse - (z @ cw if cw is not None else z.sum(dim=1))
    else:
        smooth = torch.zeros_like(lse)
    return smooth, (lse.square() if cfg.z_loss > 0.0 else torch.zeros_like(lse))


def _softmax_times_(z: torch.Tensor, lse: torch.Tensor, row_coef: torch.Tensor, cfg: LossConfig,
                    cw: torch.Tensor | None, a_sm: torch.Tensor) -> torch.Tensor:
    """``row_coef * softmax(z) - a_sm * w`` (the smoothing term's gradient), in place of ``z``
    (a private copy or the caller's scratch logits)."""
    grad = z.sub_(lse.unsqueeze(1))
    grad.exp_().mul_(row_coef.unsqueeze(1))
    if cfg.label_smoothing > 0.0:
        grad.sub_(a_sm * cw if cw is not None else a_sm)
    return grad


def _row_coefficient(nll_coef: torch.Tensor, lse: torch.Tensor, cfg: LossConfig, coefs: torch.Tensor) -> torch.Tensor:
    """Each row's factor on softmax(z) in the gradient: the nll, smoothing and z-loss terms'."""
    row_coef = nll_coef.clone()
    if cfg.label_smoothing > 0.0:
        row_coef += coefs[1] * coefs[3]
    if cfg.z_loss > 0.0:
        row_coef += 2.0 * coefs[2] * lse
    return row_coef


def _index_rows(z: torch.Tensor, target: torch.Tensor, cfg: LossConfig, cw: torch.Tensor | None,
                coefs: torch.Tensor, want_grad: bool) -> _Rows:
    """Class-index targets: ``nll_i = w[y_i] * (lse_i - z[i, y_i])``; ignored rows give zeros."""
    ct = z.dtype
    valid = target != cfg.ignore_index
    safe_t = torch.where(valid, target, torch.zeros_like(target)).unsqueeze(1)
    lse = torch.logsumexp(z, dim=1)
    zero = torch.zeros((), dtype=ct, device=z.device)
    w_y = cw[safe_t.squeeze(1)] if cw is not None else None
    picked = lse - z.gather(1, safe_t).squeeze(1)
    nll = torch.where(valid, picked * w_y if w_y is not None else picked, zero)
    smooth, lse_sq = _smoothing_and_z_terms(z, lse, cfg, cw, coefs)
    smooth, lse_sq = torch.where(valid, smooth, zero), torch.where(valid, lse_sq, zero)
    if not want_grad:
        return nll, smooth, lse_sq, None
    nll_coef = coefs[0] * w_y if w_y is not None else coefs[0].expand_as(lse)
    grad = _softmax_times_(z, lse, _row_coefficient(nll_coef, lse, cfg, coefs), cfg, cw, coefs[1])
    grad.scatter_add_(1, safe_t, -nll_coef.unsqueeze(1))
    grad.masked_fill_(~valid.unsqueeze(1), 0.0)
    return nll, smooth, lse_sq, grad


def _probability_rows(z: torch.Tensor, target: torch.Tensor, cfg: LossConfig, cw: torch.Tensor | None,
                      coefs: torch.Tensor, want_grad: bool) -> _Rows:
    """Class-probability targets ``y`` (``[n, C]``): ``nll_i = sum_c w[c] * y[i, c] * (lse_i -
    z[i, c])``, whose gradient is ``(sum_c' w[c'] y[i, c']) * p[i, c] - w[c] * y[i, c]``. Holds
    one more chunk-sized buffer than the class-index pass (``w * y``)."""
    y = target.to(z.dtype)
    wy = y * cw if cw is not None else y
    wy_sum = wy.sum(dim=1)
    lse = torch.logsumexp(z, dim=1)
    nll = lse * wy_sum - (wy * z).sum(dim=1)
    smooth, lse_sq = _smoothing_and_z_terms(z, lse, cfg, cw, coefs)
    if not want_grad:
        return nll, smooth, lse_sq, None
    grad = _softmax_times_(z, lse, _row_coefficient(coefs[0] * wy_sum, lse, cfg, coefs), cfg, cw, coefs[1])
    grad.addcmul_(wy, -coefs[0])  # not in place on wy: without class weights it may be the caller's target
    return nll, smooth, lse_sq, grad
