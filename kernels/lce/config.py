"""Validated, immutable description of one linear + cross-entropy call."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import LCETypeError, LCEValueError

REDUCTIONS = ("mean", "sum", "none")
IMPLEMENTATIONS = ("auto", "reference", "chunked", "triton")


@dataclass(frozen=True)
class LossConfig:
    """The loss's semantics (independent of how it is computed).

    The per-row loss of a non-ignored row ``i`` with target ``y`` and logits ``z``
    (after the optional soft-cap ``z = cap * tanh(z / cap)``) is, exactly as
    ``F.cross_entropy`` defines it,

        (1 - eps) * w[y] * (lse - z[y]) + eps / C * sum_c w[c] * (lse - z[c]) + z_loss * lse**2

    where ``lse = logsumexp(z)`` and ``w`` are the class weights (ones by default).
    Ignored rows contribute zero. ``"mean"`` divides the cross-entropy terms by
    ``sum w[y]`` over non-ignored rows (the number of non-ignored rows without class
    weights), as ``F.cross_entropy`` does, and the z-loss term by the number of
    non-ignored rows (class weights rescale the classification term only).
    """

    reduction: str = "mean"
    ignore_index: int = -100
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    softcap: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.reduction, str) or self.reduction not in REDUCTIONS:
            raise LCEValueError(f"reduction must be one of {REDUCTIONS}, got {self.reduction!r}")
        if isinstance(self.ignore_index, bool) or not isinstance(self.ignore_index, int):
            raise LCETypeError(f"ignore_index must be an int, got {type(self.ignore_index).__name__}")
        _check_real("label_smoothing", self.label_smoothing)
        if not 0.0 <= self.label_smoothing <= 1.0:
            raise LCEValueError(f"label_smoothing must be in [0, 1], got {self.label_smoothing}")
        _check_real("z_loss", self.z_loss)
        if not (math.isfinite(self.z_loss) and self.z_loss >= 0.0):
            raise LCEValueError(f"z_loss must be a finite number >= 0, got {self.z_loss}")
        if self.softcap is not None:
            _check_real("softcap", self.softcap)
            if not (math.isfinite(self.softcap) and self.softcap > 0.0):
                raise LCEValueError(f"softcap must be None or a finite number > 0, got {self.softcap}")


def as_real(name: str, value: object) -> float:
    """``float(value)`` for a number (a Python or NumPy scalar, a one-element tensor), else
    :class:`LCETypeError` (``float()`` alone would take ``"0.1"``, and ``True`` as 1.0)."""
    if isinstance(value, (str, bytes, bool)):
        raise LCETypeError(f"{name} must be a real number, got {type(value).__name__}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError) as exc:
        raise LCETypeError(f"{name} must be a real number, got {type(value).__name__}") from exc


def _check_real(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LCETypeError(f"{name} must be a real number, got {type(value).__name__}")


def compute_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """Row-wise softmax math runs in at least float32 (float64 for float64 inputs)."""
    return torch.promote_types(dtype, torch.float32)


def reduction_coefficients(
    cfg: LossConfig,
    target: torch.Tensor,
    class_weight: torch.Tensor | None,
    num_classes: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Return ``[a_nll, a_smooth, a_z, sum_c w[c]]`` as a device tensor (no host sync).

    ``target`` holds class indices, or class probabilities (rows x C; then ``"mean"`` divides
    by the number of rows, as ``F.cross_entropy`` does for them, and ``nll_i`` below stands for
    ``sum_c w[c] * y[i, c] * (lse_i - z[i, c])``).

    The reduced loss is ``a_nll * sum_i nll_i + a_smooth * sum_i smooth_i + a_z * sum_i lse_i**2``
    (over non-ignored rows); with ``reduction="none"`` the same coefficients weight each row.
    A zero denominator gives inf here and NaN in the loss, as ``F.cross_entropy`` does.
    """
    eps = float(cfg.label_smoothing)
    dev = target.device
    probabilities = target.is_floating_point()  # (rows, C): every row counts, "mean" is per row
    valid = torch.ones(target.shape[0], dtype=torch.bool, device=dev) if probabilities else target != cfg.ignore_index
    # torch.full, not torch.tensor(..., device=dev): a blocking host-to-device copy synchronises
    # the host with the GPU's stream (every call would wait for all queued work)
    w_sum = class_weight.sum(dtype=dtype) if class_weight is not None else torch.full((), float(num_classes), dtype=dtype, device=dev)
    one = torch.ones((), dtype=dtype, device=dev)
    if cfg.reduction != "mean":
        return torch.stack([one * (1.0 - eps), one * (eps / num_classes), one * cfg.z_loss, w_sum])
    n_valid = valid.sum(dtype=dtype)
    if class_weight is not None and not probabilities:
        safe = torch.where(valid, target, torch.zeros_like(target))
        denom = torch.where(valid, class_weight.to(dtype)[safe], torch.zeros((), dtype=dtype, device=dev)).sum()
    else:
        denom = n_valid
    return torch.stack([(1.0 - eps) / denom, (eps / num_classes) / denom, cfg.z_loss / n_valid, w_sum])
