"""The chunked and Triton implementations as custom operators, for ``torch.compile``.

Eagerly ``linear_cross_entropy`` runs an autograd Function (the least host work per call).
Under ``torch.compile`` Dynamo cannot trace that Function's chunk loop over Triton launches and
CPU-side target checks, so there the call becomes ``tc_kernels::linear_cross_entropy``: one
opaque node with a fake implementation, which runs the same driver eagerly inside the compiled
graph. As in eager mode, ``"mean"``/``"sum"`` produce the input gradients in the forward pass
(returned as extra outputs and scaled by the upstream gradient in backward: Inductor writes
the product into the saved gradients' own buffers, which the backward donates, so it costs
no memory but one elementwise pass over each gradient, which the eager path skips on CUDA
when the scale is 1; a mutating scale operator would keep the pass too, as a copy of each
buffer onto itself); ``"none"`` recomputes them in
``tc_kernels::linear_cross_entropy_backward``. Gradients not asked for come back as empty
tensors (an operator returns tensors only).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..triton_launch import on_device
from .config import LossConfig, compute_dtype_for, reduction_coefficients
from .plan import Plan, check_targets_on_cpu, losses, run
from .rowwise import torch_row_pass
from .column_kernels import triton_column_pass
from .triton_kernels import triton_row_pass

__all__ = ["linear_cross_entropy_op"]


def _plan(x: Tensor, reduction: str, ignore_index: int, label_smoothing: float, z_loss: float,
          softcap: float | None, triton: bool, chunk_size: int, slab_rows: int, accum_dtype: torch.dtype) -> Plan:
    class_major = triton and slab_rows > 0
    return Plan(cfg=LossConfig(reduction, ignore_index, label_smoothing, z_loss, softcap),
                row_pass=triton_row_pass if triton else torch_row_pass, chunk_size=chunk_size,
                accum_dtype=accum_dtype, target_shape=(), return_dtype=compute_dtype_for(x.dtype),
                column_pass=triton_column_pass if class_major else None, slab_rows=slab_rows if class_major else 0)


def _grads_or_empty(x: Tensor, grads: tuple[Tensor | None, ...]) -> tuple[Tensor, ...]:
    return tuple(g if g is not None else x.new_empty(0) for g in grads)


@torch.library.custom_op("tc_kernels::linear_cross_entropy", mutates_args=())
def linear_cross_entropy_op(x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None,
                            class_weight: Tensor | None, reduction: str, ignore_index: int, label_smoothing: float,
                            z_loss: float, softcap: float | None, triton: bool, chunk_size: int,
                            slab_rows: int, accum_dtype: torch.dtype, need: list[bool]
                            ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(loss, z_loss, dx, dw, db)`` of 2-D ``x``, ``weight`` and flat ``target``; ``loss`` is
    per row for ``"none"``; ``need`` says which gradients a ``"mean"``/``"sum"`` call produces."""
    plan = _plan(x, reduction, ignore_index, label_smoothing, z_loss, softcap, triton, chunk_size, slab_rows,
                 accum_dtype)
    check_targets_on_cpu(target, weight.shape[0], ignore_index)
    grads = (False, False, False) if reduction == "none" else (need[0], need[1], need[2] and bias is not None)
    with on_device(x.device):  # the Triton row kernels launch on the current device
        loss, z, _, res = losses(x, weight, target, bias, class_weight, plan, grads=grads)
    return (loss, z, *_grads_or_empty(x, (res.grad_input, res.grad_weight, res.grad_bias)))


@linear_cross_entropy_op.register_fake
def _(x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, class_weight: Tensor | None, reduction: str,
      ignore_index: int, label_smoothing: float, z_loss: float, softcap: float | None, triton: bool, chunk_size: int,
      slab_rows: int, accum_dtype: torch.dtype, need: list[bool]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    ct = compute_dtype_for(x.dtype)
    shape = (x.shape[0],) if reduction == "none" else ()
    on = reduction != "none"
    grads = (x.new_empty(x.shape) if on and need[0] else None,
             weight.new_empty(weight.shape) if on and need[1] else None,
             bias.new_empty(bias.shape) if on and need[2] and bias is not None else None)
    return (x.new_empty(shape, dtype=ct), x.new_empty(shape, dtype=ct), *_grads_or_empty(x, grads))


@torch.library.custom_op("tc_kernels::linear_cross_entropy_backward", mutates_args=())
def linear_cross_entropy_backward_op(x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None,
                                     class_weight: Tensor | None, row_scale: Tensor, ignore_index: int,
                                     label_smoothing: float, z_loss: float, softcap: float | None, triton: bool,
                                     chunk_size: int, slab_rows: int, accum_dtype: torch.dtype, need: list[bool]
                                     ) -> tuple[Tensor, Tensor, Tensor]:
    """``(dx, dw, db)`` of a ``"none"`` call, each row's loss weighted by ``row_scale``."""
    plan = _plan(x, "none", ignore_index, label_smoothing, z_loss, softcap, triton, chunk_size, slab_rows,
                 accum_dtype)
    coefs = reduction_coefficients(plan.cfg, target, class_weight, weight.shape[0], plan.return_dtype)
    with on_device(x.device):
        res = run(x, weight, target, bias, class_weight, plan, coefs,
                  grads=(need[0], need[1], need[2] and bias is not None), row_scale=row_scale)
    return _grads_or_empty(x, (res.grad_input, res.grad_weight, res.grad_bias))


@linear_cross_entropy_backward_op.register_fake
def _(x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, class_weight: Tensor | None,
      row_scale: Tensor, ignore_index: int, label_smoothing: float, z_loss: float, softcap: float | None,
      triton: bool, chunk_size: int, slab_rows: int, accum_dtype: torch.dtype, need: list[bool]
      ) -> tuple[Tensor, Tensor, Tensor]:
    return _grads_or_empty(x, (x.new_empty(x.shape) if need[0] else None,
                               weight.new_empty(weight.shape) if need[1] else None,
                               bias.new_empty(bias.shape) if need[2] and bias is not None else None))


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, ...]) -> None:
    x, weight, target, bias, class_weight, reduction, *options = inputs
    ctx.reduction, ctx.options, ctx.has_bias = reduction, options, bias is not None
    if reduction == "none":
        ctx.save_for_backward(x, weight, target, bias, class_weight)
    else:
        ctx.save_for_backward(*output[2:])


def _backward(ctx, grad_loss: Tensor, _grad_z: Tensor, *_grads_of_grads: Tensor) -> tuple[Tensor | None, ...]:
    need = ctx.options[-1]
    if ctx.reduction == "none":
        x, weight, target, bias, class_weight = ctx.saved_tensors
        gx, gw, gb = linear_cross_entropy_backward_op(x, weight, target, bias, class_weight,
                                                      grad_loss.reshape(-1), *ctx.options)
    else:
        scale = grad_loss.reshape(())
        gx, gw, gb = (g * scale.to(g.dtype) for g in ctx.saved_tensors)
    grads = (gx if need[0] else None, gw if need[1] else None, gb if need[2] and ctx.has_bias else None)
    return (grads[0], grads[1], None, grads[2], *([None] * 11))


linear_cross_entropy_op.register_autograd(_backward, setup_context=_setup_context)
