"""Entry point: argument checks, routing between implementations, and the autograd Function."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, fields
from typing import Any

import torch

from ..triton_launch import on_device
from .chunked import default_chunk_size
from .class_major import class_major_grad_dtype, class_major_slab_rows
from .column_kernels import triton_column_pass
from .config import IMPLEMENTATIONS, LossConfig, as_real, compute_dtype_for
from .errors import (
    BackwardTwiceError,
    LCEDeviceError,
    LCETypeError,
    LCEValueError,
    UnsupportedFeatureError,
)
from .ops import linear_cross_entropy_op
from .plan import Plan, check_targets_on_cpu, losses, run
from .reference import reference_linear_cross_entropy
from .rowwise import torch_row_pass
from .triton_kernels import triton_importable, triton_row_pass, triton_scale_, triton_usable

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class Route:
    """Which implementation a call takes, and why (``select_implementation``'s answer).

    ``fallback``: ``"auto"`` took a slower implementation than the tensors' device would get
    for class-index targets and a 2-D weight (the call warns)."""

    implementation: str
    reason: str
    fallback: bool = False


def select_implementation(
    requested: str,
    input: torch.Tensor,
    weight: torch.Tensor,
    probabilities: bool = False,
) -> Route:
    """Resolve ``implementation=`` for these tensors, or raise ``UnsupportedFeatureError``.

    ``probabilities``: the target holds class probabilities (the Triton row kernel takes class
    indices only, so ``"auto"`` then takes the chunked implementation on CUDA too)."""
    if requested not in IMPLEMENTATIONS:
        raise LCEValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {requested!r}")
    k_dim = weight.dim() > 2
    if requested == "reference":
        return Route("reference", "requested")
    if requested == "triton" and probabilities:
        raise UnsupportedFeatureError(
            "implementation='triton' takes class-index targets; class probabilities need 'chunked' or 'auto'"
        )
    if requested in ("chunked", "triton") and k_dim:
        raise UnsupportedFeatureError(
            f"implementation={requested!r} supports 2-D weights (C, H) only; a K-dimensional "
            f"weight of shape {tuple(weight.shape)} needs implementation='reference' or 'auto'"
        )
    if requested == "triton":
        if not triton_importable():
            raise UnsupportedFeatureError("implementation='triton' needs the triton package, which is not installed")
        if not triton_usable(input.device):
            raise UnsupportedFeatureError(
                f"implementation='triton' needs CUDA tensors, got device {input.device} "
                "(use 'chunked' or 'auto' elsewhere)"
            )
        if input.dtype not in _TRITON_DTYPES:
            raise UnsupportedFeatureError(
                f"implementation='triton' supports float16, bfloat16 and float32, got {input.dtype}"
            )
        return Route("triton", "requested")
    if requested == "chunked":
        return Route("chunked", "requested")
    if k_dim:
        return Route("reference", "K-dimensional weight: only the reference implementation supports it", True)
    if probabilities and input.device.type == "cuda":
        return Route("chunked", "class-probability targets: the Triton row kernel takes class indices", True)
    if input.device.type == "cuda" and input.dtype in _TRITON_DTYPES and triton_usable(input.device):
        return Route("triton", "CUDA tensor with triton available")
    return Route("chunked", f"{input.device.type} tensor" + ("" if input.device.type != "cuda" else ", no triton"))


def _validate(
    input: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    class_weight: torch.Tensor | None,
    chunk_size: int | None,
    accum_dtype: torch.dtype,
    master_weight: bool = False,
) -> None:
    for name, t in (("input", input), ("weight", weight), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise LCETypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if input.dtype not in _FLOAT_DTYPES:
        raise LCETypeError(f"input must be a floating-point tensor, got dtype {input.dtype}")
    if weight.dtype != input.dtype and not master_weight:
        raise LCETypeError(f"weight dtype {weight.dtype} differs from input dtype {input.dtype}")
    if target.is_complex() or target.dtype == torch.bool:
        raise LCETypeError(
            f"target must hold integer class indices or floating-point class probabilities, got dtype {target.dtype}"
        )
    if input.dim() < 1:
        raise LCEValueError("input must have at least one dimension (the features)")
    if weight.dim() < 2:
        raise LCEValueError(f"weight must be (num_classes, in_features), got shape {tuple(weight.shape)}")
    hidden = input.shape[-1]
    if weight.shape[-1] != hidden:
        raise LCEValueError(
            f"weight's last dimension ({weight.shape[-1]}) must equal input's feature size ({hidden})"
        )
    if weight.shape[0] < 1:
        raise LCEValueError("weight must have at least one class")
    out_dims = tuple(weight.shape[1:-1])
    rows = tuple(input.shape[:-1])
    if target.is_floating_point():
        probs_shape = rows + (weight.shape[0],) + out_dims  # the logits' shape
        if tuple(target.shape) != probs_shape:
            raise LCEValueError(
                f"a floating-point target holds class probabilities of shape {probs_shape} (input's rows x "
                f"classes), got {tuple(target.shape)}; class indices must be an integer tensor"
            )
    elif tuple(target.shape) != rows + out_dims:
        raise LCEValueError(
            f"target shape {tuple(target.shape)} does not match input/weight; expected {rows + out_dims}"
        )
    if out_dims and input.dim() > 2:
        raise LCEValueError("a K-dimensional weight needs input of shape (N, H) or (H,)")
    logits_shape = tuple(weight.shape[:-1])
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise LCETypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if bias.dtype != input.dtype:
            raise LCETypeError(f"bias dtype {bias.dtype} differs from input dtype {input.dtype}")
        if tuple(bias.shape) != logits_shape:
            raise LCEValueError(f"bias must have shape {logits_shape}, got {tuple(bias.shape)}")
    if class_weight is not None:
        if not isinstance(class_weight, torch.Tensor):
            raise LCETypeError(f"class_weight must be a torch.Tensor or None, got {type(class_weight).__name__}")
        if not class_weight.is_floating_point():
            raise LCETypeError(f"class_weight must be floating point, got dtype {class_weight.dtype}")
        if tuple(class_weight.shape) != (weight.shape[0],):
            raise LCEValueError(
                f"class_weight must have shape ({weight.shape[0]},), got {tuple(class_weight.shape)}"
            )
    tensors = [("weight", weight), ("target", target), ("bias", bias), ("class_weight", class_weight)]
    for name, t in tensors:
        if t is not None and t.device != input.device:
            raise LCEDeviceError(f"{name} is on {t.device} but input is on {input.device}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise LCEValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    if not isinstance(accum_dtype, torch.dtype):
        raise LCETypeError(f"accum_dtype must be a torch.dtype, got {type(accum_dtype).__name__}")
    if accum_dtype not in (torch.float32, torch.float64, input.dtype):
        raise LCEValueError(
            f"accum_dtype must be torch.float32, torch.float64 or the input dtype ({input.dtype}), got {accum_dtype}"
        )


def _apply_autocast(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool]:
    """Inside an autocast region, run the projection in the autocast dtype (as ``F.linear`` would).

    A float32 2-D weight under bf16/fp16 autocast stays as it is (the last item is then True):
    the matrix products use a copy in the autocast dtype, and its gradient is accumulated in
    float32 straight into the float32 gradient, never rounded to the autocast dtype on the way
    (``F.linear`` would round it: its weight gradient is computed in bf16 and then upcast)."""
    if not isinstance(input, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return input, weight, bias, False
    device_type = input.device.type
    if device_type not in ("cuda", "cpu") or not torch.is_autocast_enabled(device_type):
        return input, weight, bias, False
    dtype = torch.get_autocast_dtype(device_type)

    def cast(t: torch.Tensor | None) -> torch.Tensor | None:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != dtype:
            return t.to(dtype)
        return t

    master = weight.dim() == 2 and weight.dtype == torch.float32 and dtype in (torch.bfloat16, torch.float16)
    return cast(input), weight if master else cast(weight), cast(bias), master


class LinearCrossEntropyFunction(torch.autograd.Function):
    """Autograd Function over the chunked driver.

    For ``"mean"``/``"sum"`` the gradients are computed during the forward pass (one pass
    over the logits instead of two) and scaled by the upstream gradient in ``backward``;
    they are consumed there, so a second backward raises :class:`BackwardTwiceError`.
    For ``"none"`` the backward pass recomputes the logits chunk by chunk. There is no double
    backward: a backward with ``create_graph=True`` raises :class:`UnsupportedFeatureError`.
    """

    @staticmethod
    def forward(ctx: Any, x, weight, target, bias, class_weight, plan: Plan):  # type: ignore[override]
        need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[3])
        ctx.plan = plan
        ctx.need = need
        if plan.cfg.reduction == "none":
            loss, z, coefs, _ = losses(x, weight, target, bias, class_weight, plan)
            ctx.save_for_backward(x, weight, target, bias, class_weight, coefs)
        else:
            loss, z, _, res = losses(x, weight, target, bias, class_weight, plan, grads=need)
            ctx.grads = (res.grad_input, res.grad_weight, res.grad_bias)
        loss, z = loss.reshape(plan.loss_shape), z.reshape(plan.loss_shape)
        ctx.mark_non_differentiable(z)
        return loss, z

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, _grad_z: torch.Tensor):  # type: ignore[override]
        if torch.is_grad_enabled():  # create_graph=True: these gradients would be constants to autograd
            raise UnsupportedFeatureError(
                "linear_cross_entropy has no double backward (a backward with create_graph=True): its "
                "gradients come from fused passes, not from differentiable ops; implementation='reference' has one"
            )
        plan: Plan = ctx.plan
        if plan.cfg.reduction == "none":
            x, weight, target, bias, class_weight, coefs = ctx.saved_tensors
            row_scale = grad_loss.reshape(-1)
            res = run(x, weight, target, bias, class_weight, plan, coefs, grads=ctx.need, row_scale=row_scale)
            gx, gw, gb = res.grad_input, res.grad_weight, res.grad_bias
        else:
            if ctx.grads is None:
                raise BackwardTwiceError(
                    "linear_cross_entropy: backward ran twice through a 'mean'/'sum' loss; its gradients "
                    "are computed in the forward pass and consumed by the first backward"
                )
            gx, gw, gb = ctx.grads
            ctx.grads = None
            scale = grad_loss.reshape(())
            gx, gw, gb = (_scale_(g, scale) if g is not None else None for g in (gx, gw, gb))
        return gx, gw, None, gb, None, None


def _scale_(grad: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``grad *= scale`` in place; on CUDA a kernel that skips the pass when scale is 1 (a
    plain ``mul_`` there reads and writes the whole weight gradient: 1.6 ms at V=128256)."""
    if grad.is_cuda and grad.is_contiguous() and triton_usable(grad.device):
        return triton_scale_(grad, scale)
    return grad.mul_(scale.to(grad.dtype))


def _class_major_slab_rows(x: torch.Tensor, weight: torch.Tensor, accum_dtype: torch.dtype) -> int:
    """Classes per dW slab when the weight gradient's buffer can hold every token's logits
    (``class_major.py``), else 0 (row chunks)."""
    grad_dtype = class_major_grad_dtype(x.dtype, weight.dtype, accum_dtype)
    if grad_dtype is None:
        return 0
    return class_major_slab_rows(x.shape[0], x.shape[1], weight.shape[0], x.element_size(), grad_dtype.itemsize)


def linear_cross_entropy(
    input: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    class_weight: torch.Tensor | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    return_z_loss: bool = False,
    chunk_size: int | None = None,
    accum_dtype: torch.dtype = torch.float32,
    implementation: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of ``input @ weight.T + bias`` against ``target``, without full logits.

    Semantics are ``F.cross_entropy``'s (class weights, ``ignore_index``, label smoothing and
    the three reductions, including its normalisation rules), plus a PaLM-style z-loss
    (``z_loss * logsumexp**2`` per non-ignored row; ``"mean"`` divides it by the number of
    non-ignored rows) and an optional soft-cap ``softcap * tanh(logits / softcap)`` applied
    before the softmax.

    Args:
        input: ``(..., H)`` activations (float16, bfloat16, float32 or float64).
        weight: ``(C, H)`` classifier (e.g. a tied embedding), same dtype as ``input``.
        target: ``input.shape[:-1]`` integer class indices, or floating-point class
            probabilities of the logits' shape, ``input.shape[:-1] + (C,)`` (``(C, *K)`` after
            the rows for a K-dimensional weight), as ``F.cross_entropy`` takes them (label
            smoothing mixes them with the uniform distribution, ``"mean"`` divides by the number
            of rows, ``ignore_index`` does not apply and must stay at its default; on CUDA
            ``"auto"`` computes them with the chunked implementation and says so).
        bias: optional ``(C,)`` bias.
        class_weight: optional ``(C,)`` per-class rescaling (``F.cross_entropy``'s ``weight``).
        return_z_loss: also return the z-loss term (detached; it is already in ``loss``).
        chunk_size: rows per chunk (default: the logits buffer stays within a fixed budget:
            on CUDA 256 MiB, or 512 MiB when a float32 weight-gradient accumulator is held
            anyway, or every row in one chunk when its logits take no more memory than that
            accumulator, which one chunk does not need; 64 MiB elsewhere). Unset, a Triton call
            that produces the weight gradient holds no logits buffer at all where every row's
            logits fit in that gradient's own buffer plus a tail of at most 64 MiB (about
            N <= H tokens): the class-major layout of ``class_major.py``.
        accum_dtype: dtype of the weight/bias-gradient accumulator across chunks: float32
            (default), float64, or the input dtype to accumulate in the gradient itself (saves
            a weight-sized float32 buffer, at one rounding per chunk). Under bf16/fp16 autocast
            a float32 weight keeps float32: its gradient is the accumulator (no extra buffer,
            no rounding to the autocast dtype).
        implementation: ``"auto"`` (Triton on CUDA, chunked elsewhere, reference for a
            K-dimensional weight), ``"reference"``, ``"chunked"`` or ``"triton"``;
            ``select_implementation`` tells which one ``"auto"`` takes.

    Returns:
        The loss (a scalar, or ``target.shape`` for ``"none"``) in float32 for bf16/fp16/fp32
        inputs (float64 for float64: a bf16 scalar loss would keep only 3 significant digits),
        and with ``return_z_loss`` a ``(loss, z_loss)`` pair.
    """
    cfg = LossConfig(reduction, ignore_index, as_real("label_smoothing", label_smoothing), as_real("z_loss", z_loss),
                     None if softcap is None else as_real("softcap", softcap))
    input, weight, bias, master_weight = _apply_autocast(input, weight, bias)
    if not isinstance(implementation, str):
        raise LCETypeError(f"implementation must be a str, got {type(implementation).__name__}")
    _validate(input, weight, target, bias, class_weight, chunk_size, accum_dtype, master_weight)
    probabilities = target.is_floating_point()
    if probabilities and ignore_index != -100:
        raise LCEValueError(
            f"ignore_index={ignore_index} applies to class-index targets only; "
            "class-probability targets take none (as F.cross_entropy)"
        )
    route = select_implementation(implementation, input, weight, probabilities)
    compiling = torch.compiler.is_compiling()
    if not compiling:  # under torch.compile the operator checks them (a data-dependent branch)
        check_targets_on_cpu(target, weight.shape[0], ignore_index)
    if route.fallback and not compiling:  # Dynamo cannot trace a warning (select_implementation tells)
        warnings.warn(f"linear_cross_entropy: using the {route.implementation} implementation ({route.reason})",
                      stacklevel=2)
    if route.implementation == "reference":
        weight = weight.to(input.dtype) if master_weight else weight
        loss, z = reference_linear_cross_entropy(input, weight, target, bias, cfg, class_weight)
        return (loss, z) if return_z_loss else loss

    x2d = input.reshape(math.prod(input.shape[:-1]), input.shape[-1])  # not -1: ambiguous when H is 0
    if not x2d.is_contiguous():
        x2d = x2d.contiguous()
    w2d = weight if weight.is_contiguous() else weight.contiguous()
    if probabilities:  # (rows, C); the row pass converts each chunk to its math's dtype
        flat_target = target.reshape(-1, target.shape[-1])
    else:
        flat_target = target.reshape(-1)
        if flat_target.dtype != torch.int64:
            flat_target = flat_target.long()
    n, num_classes = x2d.shape[0], w2d.shape[0]
    needs_grad = torch.is_grad_enabled() and (
        input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    wide = weight.requires_grad and torch.promote_types(accum_dtype, weight.dtype) != weight.dtype
    rows = chunk_size or default_chunk_size(n, num_classes, input.dtype, input.device,
                                            accumulator_bytes=num_classes * x2d.shape[1] * 4 if wide else 0)
    triton_route = route.implementation == "triton"
    slab_rows = 0
    if triton_route and chunk_size is None and not probabilities and needs_grad and weight.requires_grad:
        slab_rows = _class_major_slab_rows(x2d, w2d, accum_dtype)
    plan = Plan(
        cfg=cfg,
        row_pass=triton_row_pass if triton_route else torch_row_pass,
        chunk_size=rows,
        accum_dtype=accum_dtype,
        target_shape=tuple(target.shape[:-1] if probabilities else target.shape),
        return_dtype=compute_dtype_for(input.dtype),
        column_pass=triton_column_pass if slab_rows else None,
        slab_rows=slab_rows,
    )
    cw = class_weight.to(compute_dtype_for(input.dtype)) if class_weight is not None else None
    if compiling:
        need = [needs_grad and input.requires_grad, needs_grad and weight.requires_grad,
                needs_grad and bias is not None and bias.requires_grad]
        # the fields one by one: dataclasses.astuple deep-copies each, which torch 2.11's dynamo
        # refuses (a graph break: "copy.deepcopy()")
        cfg_args = tuple(getattr(cfg, f.name) for f in fields(cfg))
        loss, z, *_ = linear_cross_entropy_op(x2d, w2d, flat_target, bias, cw, *cfg_args,
                                              triton_route, rows, slab_rows, accum_dtype, need)
        loss, z = loss.reshape(plan.loss_shape), z.detach().reshape(plan.loss_shape)
        return (loss, z) if return_z_loss else loss
    with on_device(x2d.device):  # the Triton row kernels launch on the current device
        if needs_grad:
            loss, z = LinearCrossEntropyFunction.apply(x2d, w2d, flat_target, bias, cw, plan)
        else:
            loss, z, _, _ = losses(x2d, w2d, flat_target, bias, cw, plan)
            loss, z = loss.reshape(plan.loss_shape), z.reshape(plan.loss_shape)
    return (loss, z) if return_z_loss else loss
