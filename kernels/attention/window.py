"""The differentiable entry point of the sliding-window kernel (``window_triton.py``).

Eagerly a call goes through a ``torch.autograd.Function`` (the cheapest host path: a
sub-millisecond attention call is often paced by the host). Under ``torch.compile`` it goes
through two custom operators (``tc_kernels::window_attention`` and its backward) with fake
implementations, so Dynamo records one opaque node per call instead of breaking the graph at
the Triton launches, and ``fullgraph=True`` compiles a model that uses the kernel. Both paths
run the same launchers on the same launch shapes; the kernels stay eager either way.
"""
from __future__ import annotations

import math
from types import ModuleType

import torch
from torch import Tensor

from ..triton_launch import on_device
from . import window_triton as _kernels
from .errors import AttentionError, AttentionInputError
from .layout import aligned

__all__ = ["window_attention"]


def _prepared(*tensors: Tensor) -> tuple[Tensor, ...]:
    """The operands as the kernels take them: contiguous, on a 16-byte-aligned base."""
    return tuple(aligned(t.contiguous()) for t in tensors)


def _forward(q: Tensor, k: Tensor, v: Tensor, window: int, scale: float, kernels: ModuleType = _kernels
             ) -> tuple[Tensor, Tensor]:
    """``(out, lse2)`` for prepared operands (the LSE in log2 units, float32)."""
    cfg = kernels.window_config(q.device, q.shape[-1])
    with on_device(q.device):  # the kernels launch on the current device; q's may be another
        return kernels.launch_forward(q, k, v, window, scale, cfg.fwd)


def _backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse2: Tensor, do: Tensor, window: int,
              scale: float, kernels: ModuleType = _kernels) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` for prepared operands."""
    cfg = kernels.window_config(q.device, q.shape[-1])
    with on_device(q.device):
        return kernels.backward(q, k, v, o, lse2, do, window, scale, cfg)


class WindowAttentionFunction(torch.autograd.Function):
    """The eager path: ``apply(q, k, v, window, scale, kernels=window_triton)`` -> ``(out, lse2)``.

    ``kernels``: the module of launchers to run (``benchmarks/diagnostics/window_tune.py --baseline`` passes
    a ``window_triton.py`` of another commit)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, window: int, scale: float,  # type: ignore[override]
                kernels: ModuleType = _kernels):
        q, k, v = _prepared(q, k, v)
        o, lse2 = _forward(q, k, v, window, scale, kernels)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.window, ctx.scale, ctx.kernels = window, scale, kernels
        ctx.mark_non_differentiable(lse2)
        ctx.set_materialize_grads(False)  # no zeros for the LSE's gradient, which is never used
        return o, lse2

    @staticmethod
    def backward(ctx, do: Tensor | None, _dlse: Tensor | None):  # type: ignore[override]
        if do is None:  # only the LSE was used downstream: it has no gradient
            return None, None, None, None, None, None
        if torch.is_grad_enabled():  # create_graph=True: the kernels' gradients would be constants to autograd
            raise AttentionError("the sliding-window kernel has no double backward (a backward with "
                                 "create_graph=True); backend='sdpa' or 'math' has one")
        q, k, v, o, lse2 = ctx.saved_tensors
        return (*_backward(q, k, v, o, lse2, *_prepared(do), ctx.window, ctx.scale, ctx.kernels), None, None, None)


@torch.library.custom_op("tc_kernels::window_attention", mutates_args=())
def _window_attention_op(q: Tensor, k: Tensor, v: Tensor, window: int, scale: float) -> tuple[Tensor, Tensor]:
    """``(out, lse2)``: the forward kernel as one operator (its outputs are fresh, contiguous)."""
    return _forward(*_prepared(q, k, v), window, scale)


@_window_attention_op.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, window: int, scale: float) -> tuple[Tensor, Tensor]:
    b, h, s, d = q.shape
    return q.new_empty((b, h, s, d)), q.new_empty((b, h, s), dtype=torch.float32)


@torch.library.custom_op("tc_kernels::window_attention_backward", mutates_args=())
def _window_attention_backward_op(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse2: Tensor, do: Tensor,
                                  window: int, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)``: the backward kernels as one operator."""
    q, k, v, do = _prepared(q, k, v, do)
    return _backward(q, k, v, o, lse2, do, window, scale)


@_window_attention_backward_op.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse2: Tensor, do: Tensor, window: int,
      scale: float) -> tuple[Tensor, Tensor, Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    q, k, v, window, scale = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.window, ctx.scale = window, scale


def _op_backward(ctx, do: Tensor | None, _dlse: Tensor | None) -> tuple[Tensor | None, ...]:
    if do is None:  # the LSE leaves the op detached, so only the output's gradient can arrive
        return None, None, None, None, None
    q, k, v, o, lse2 = ctx.saved_tensors
    return (*_window_attention_backward_op(q, k, v, o, lse2, do, ctx.window, ctx.scale), None, None)


_window_attention_op.register_autograd(_op_backward, setup_context=_setup_context)


def window_attention(q: Tensor, k: Tensor, v: Tensor, window: int, *, scale: float | None = None,
                     return_lse: bool = True) -> tuple[Tensor, Tensor | None]:
    """Causal sliding-window attention (``q - window < kv <= q``): ``(out, lse)``.

    q: (B, Hq, S, D); k, v: (B, Hkv, S, D) with Hq a multiple of Hkv; D a power of two from 16
    to 256; float16, bfloat16 or float32 (not bfloat16 under the CPU interpreter). ``lse`` is
    float32, natural log, not differentiable (None with ``return_lse=False``, which saves its
    conversion from the kernel's log2 units).
    Differentiable in q, k and v; traceable by ``torch.compile`` (``fullgraph=True`` too)."""
    why = _kernels.unsupported(q, k, v, window)
    if why is not None:
        raise AttentionInputError(why)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if torch.compiler.is_compiling():
        # contiguous before the operator, which saves its inputs for the backward: a view's
        # base (a fused QKV projection, say) would otherwise stay alive until then
        q, k, v = (t.contiguous() for t in (q, k, v))
        out, lse2 = _window_attention_op(q, k, v, window, scale)
        lse2 = lse2.detach()
    else:
        out, lse2 = WindowAttentionFunction.apply(q, k, v, window, scale)
    return out, (lse2 * math.log(2.0) if return_lse else None)
