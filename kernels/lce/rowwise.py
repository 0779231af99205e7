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
    if target.is_floating_point():
        return _probability_row_pass(logits, target, cfg, class_weight, coefs, row_scale, want_grad)
    ct = coefs.dtype
    z = logits if logits.dtype == ct else logits.to(ct)
    capped_tanh = None
    if cfg.softcap is not None:
        capped_tanh = torch.tanh(z / cfg.softcap)
        z = capped_tanh * cfg.softcap
    valid = target != cfg.ignore_index
    safe_t = torch.where(valid, target, torch.zeros_like(target)).unsqueeze(1)
    lse = torch.logsumexp(z, dim=1)
    zero = torch.zeros((), dtype=ct, device=z.device)
    w_y = class_weight.to(ct)[safe_t.squeeze(1)] if class_weight is not None else None
    picked = lse - z.gather(1, safe_t).squeeze(1)
    nll = torch.where(valid, picked * w_y if w_y is not None else picked, zero)
    if cfg.label_smoothing > 0.0:
        weighted_sum = z @ class_weight.to(ct) if class_weight is not None else z.sum(dim=1)
        smooth = torch.where(valid, coefs[3] * lse - weighted_sum, zero)
    else:
        smooth = torch.zeros_like(lse)
    lse_sq = torch.where(valid, lse.square(), zero) if cfg.z_loss > 0.0 else torch.zeros_like(lse)
    if not want_grad:
        return RowResult(nll, smooth, lse_sq, None)

    a_nll, a_sm, a_z, w_sum = coefs[0], coefs[1], coefs[2], coefs[3]
    nll_coef = a_nll * w_y if w_y is not None else a_nll.expand_as(lse)
    row_coef = nll_coef.clone()
    if cfg.label_smoothing > 0.0:
        row_coef += a_sm * w_sum
    if cfg.z_loss > 0.0:
        row_coef += 2.0 * a_z * lse
    # p = softmax(z), computed in place (z is either a private copy or the caller's scratch logits).
    grad = z.sub_(lse.unsqueeze(1))
    grad.exp_().mul_(row_coef.unsqueeze(1))
    grad.scatter_add_(1, safe_t, -nll_coef.unsqueeze(1))
    if cfg.label_smoothing > 0.0:
        grad.sub_(a_sm * class_weight.to(ct) if class_weight is not None else a_sm)
    if capped_tanh is not None:
        grad.mul_(1.0 - capped_tanh.square())
    if row_scale is not None:
        grad.mul_(row_scale.to(ct).unsqueeze(1))
    grad.masked_fill_(~valid.unsqueeze(1), 0.0)
    return RowResult(nll, smooth, lse_sq, grad.to(logits.dtype))


def _probability_row_pass(
    logits: torch.Tensor,
    target: torch.Tensor,
    cfg: LossConfig,
    class_weight: torch.Tensor | None,
    coefs: torch.Tensor,
    row_scale: torch.Tensor | None,
    want_grad: bool,
) -> RowResult:
    """The row pass for class-probability targets ``y`` (``[n, C]``): ``nll_i`` is
    ``sum_c w[c] * y[i, c] * (lse_i - z[i, c])`` (the smoothing and z-loss terms as for class
    indices), and ``d nll_i / d z[i, c] = (sum_c' w[c'] y[i, c']) * p[i, c] - w[c] * y[i, c]``.
    Holds one more chunk-sized buffer than the class-index pass (``w * y``)."""
    ct = coefs.dtype
    z = logits if logits.dtype == ct else logits.to(ct)
    capped_tanh = None
    if cfg.softcap is not None:
        capped_tanh = torch.tanh(z / cfg.softcap)
        z = capped_tanh * cfg.softcap
    cw = class_weight.to(ct) if class_weight is not None else None
    wy = target.to(ct) * cw if cw is not None else target.to(ct)
    wy_sum = wy.sum(dim=1)
    lse = torch.logsumexp(z, dim=1)
    nll = lse * wy_sum - (wy * z).sum(dim=1)
    if cfg.label_smoothing > 0.0:
        smooth = coefs[3] * lse - (z @ cw if cw is not None else z.sum(dim=1))
    else:
        smooth = torch.zeros_like(lse)
    lse_sq = lse.square() if cfg.z_loss > 0.0 else torch.zeros_like(lse)
    if not want_grad:
        return RowResult(nll, smooth, lse_sq, None)

    a_nll, a_sm, a_z, w_sum = coefs[0], coefs[1], coefs[2], coefs[3]
    row_coef = a_nll * wy_sum
    if cfg.label_smoothing > 0.0:
        row_coef = row_coef + a_sm * w_sum
    if cfg.z_loss > 0.0:
        row_coef = row_coef + 2.0 * a_z * lse
    grad = z.sub_(lse.unsqueeze(1))  # softmax in place, as in the class-index pass
    grad.exp_().mul_(row_coef.unsqueeze(1))
    grad.addcmul_(wy, -a_nll)  # not in place on wy: without class weights it is the caller's target
    if cfg.label_smoothing > 0.0:
        grad.sub_(a_sm * cw if cw is not None else a_sm)
    if capped_tanh is not None:
        grad.mul_(1.0 - capped_tanh.square())
    if row_scale is not None:
        grad.mul_(row_scale.to(ct).unsqueeze(1))
    return RowResult(nll, smooth, lse_sq, grad.to(logits.dtype))
