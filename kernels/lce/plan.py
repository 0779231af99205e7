"""One call's plan over the chunked driver, shared by the eager autograd Function and the
custom operators that ``torch.compile`` records (``ops.py``)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .chunked import ChunkedResult, chunked_linear_cross_entropy
from .class_major import class_major_grad_dtype, class_major_linear_cross_entropy, class_major_runs_here
from .config import LossConfig, reduction_coefficients
from .errors import LCEValueError
from .rowwise import RowPass


@dataclass(frozen=True)
class Plan:
    """How the driver runs one call: the loss, the row pass, rows per chunk, the dW accumulator's
    dtype, the target's shape (the loss's, for ``"none"``), the loss's dtype and, where the
    weight gradient's buffer can hold every token's logits, the class-major layout's column
    pass and classes per dW slab (``slab_rows`` 0: row chunks)."""

    cfg: LossConfig
    row_pass: RowPass
    chunk_size: int
    accum_dtype: torch.dtype
    target_shape: tuple[int, ...]
    return_dtype: torch.dtype
    column_pass: RowPass | None = None
    slab_rows: int = 0

    @property
    def loss_shape(self) -> tuple[int, ...]:
        """The loss's shape: the target's (its rows) for ``"none"``, else a scalar's."""
        return self.target_shape if self.cfg.reduction == "none" else ()


def check_targets_on_cpu(target: torch.Tensor, num_classes: int, ignore_index: int) -> None:
    """Range check for CPU targets (free there; on CUDA it would cost a host sync)."""
    if target.device.type != "cpu" or target.numel() == 0 or target.is_floating_point():
        return
    bad = (target != ignore_index) & ((target < 0) | (target >= num_classes))
    if bool(bad.any()):
        value = int(target[bad][0])
        raise LCEValueError(f"target value {value} is out of range [0, {num_classes}) and not ignore_index={ignore_index}")


def combine(cfg: LossConfig, coefs: torch.Tensor, res: ChunkedResult) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduce the per-row terms into (loss, z_loss) in the compute dtype."""
    if cfg.reduction == "none":
        per_row = coefs[0] * res.nll
        if cfg.label_smoothing > 0.0:
            per_row = per_row + coefs[1] * res.smooth
        z = coefs[2] * res.lse_sq
        return (per_row + z if cfg.z_loss > 0.0 else per_row), z
    loss = coefs[0] * res.nll.sum()
    if cfg.label_smoothing > 0.0:
        loss = loss + coefs[1] * res.smooth.sum()
    z = coefs[2] * res.lse_sq.sum()
    return (loss + z if cfg.z_loss > 0.0 else loss), z


def losses(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    class_weight: torch.Tensor | None,
    plan: Plan,
    grads: tuple[bool, bool, bool] = (False, False, False),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, ChunkedResult]:
    """``(loss, z_loss, coefs, result)`` of one call: the reduction's coefficients, the chunked
    pass (producing the gradients ``grads`` asks for) and the reduced terms, flat (per row for
    ``"none"``), in ``plan.return_dtype``."""
    coefs = reduction_coefficients(plan.cfg, target, class_weight, weight.shape[0], plan.return_dtype)
    res = run(x, weight, target, bias, class_weight, plan, coefs, grads=grads)
    loss, z = combine(plan.cfg, coefs, res)
    return loss, z, coefs, res


def run(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    class_weight: torch.Tensor | None,
    plan: Plan,
    coefs: torch.Tensor,
    grads: tuple[bool, bool, bool] = (False, False, False),
    row_scale: torch.Tensor | None = None,
) -> ChunkedResult:
    """The driver over ``plan``; ``grads``: which of dX, dW, db to produce. Calls that produce
    dW take the class-major layout where the plan has one, the row chunks otherwise."""
    if plan.slab_rows and plan.column_pass is not None and grads[1] and x.shape[0] > 0:
        grad_dtype = class_major_grad_dtype(x.dtype, weight.dtype, plan.accum_dtype)
        if grad_dtype is not None and class_major_runs_here(x, grad_dtype):
            return class_major_linear_cross_entropy(
                x, weight, target, bias, plan.cfg, class_weight, coefs, plan.column_pass,
                slab_rows=plan.slab_rows, grad_dtype=grad_dtype, need_input_grad=grads[0],
                need_bias_grad=grads[2], row_scale=row_scale, accum_dtype=plan.accum_dtype,
            )
    return chunked_linear_cross_entropy(
        x,
        weight,
        target,
        bias,
        plan.cfg,
        class_weight,
        coefs,
        plan.row_pass,
        chunk_size=plan.chunk_size,
        need_input_grad=grads[0],
        need_weight_grad=grads[1],
        need_bias_grad=grads[2],
        row_scale=row_scale,
        accum_dtype=plan.accum_dtype,
    )
