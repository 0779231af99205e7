"""The attention entry point: compiled FlexAttention with a cached block mask, SDPA otherwise.

Dispatch (``backend="auto"``):

* no mask / :class:`~kernels.attention.masks.Full` / :class:`~kernels.attention.masks.Causal`
  (square) → SDPA (flash where available; nothing sparse to exploit), unless the LSE is
  asked for;
* a causal :class:`~kernels.attention.masks.SlidingWindow` on CUDA in bf16/fp16, head dim 64 or
  128 → the dedicated Triton sliding-window kernel (``window_triton.py``; deterministic
  backward; tuned and measured at those head dims);
* any other mask → compiled ``flex_attention`` on CUDA, else SDPA with a dense boolean mask
  (or the chunked math path when the LSE is asked for). Compiled flex on CPU (inference only,
  no LSE) is used only when asked for with ``backend="flex"``.

The uncompiled flex path (which materializes S×S scores) is never taken: if compilation is
disabled, or the compiled call reaches Dynamo's recompile limit (by default a ninth length,
mask class or window size per set of kernel options), the call raises
:class:`~kernels.attention.errors.FlexEagerFallbackError`.
Under ``torch.use_deterministic_algorithms(True)`` only deterministic backward kernels are used
(flex's Triton backend; SDPA restricted to its memory-efficient and math kernels).
"""
from __future__ import annotations

import math
import numbers
import types
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .block_mask import BlockMaskCache, default_cache, flex_available
from .errors import AttentionInputError, FlexEagerFallbackError, FlexUnavailableError
from .layout import aligned
from .masks import Causal, Full, Mask, SlidingWindow
from .reference import math_attention
from .window_triton import GPU_CONFIGS as WINDOW_TUNED
from .window_triton import unsupported as window_unsupported
from .window import window_attention

__all__ = ["attention", "select_backend", "Backend"]

Backend = Literal["auto", "flex", "sdpa", "math", "triton_window"]
_BACKENDS = ("auto", "flex", "sdpa", "math", "triton_window")
_COMPILED: dict[tuple, Any] = {}  # registry: kernel options -> compiled flex call


def _flex_guarded(q: Tensor, k: Tensor, v: Tensor, block_mask: Any, scale: float,
                  enable_gqa: bool, return_lse: bool, kernel_options: dict | None):
    from torch.nn.attention.flex_attention import flex_attention

    if not torch.compiler.is_dynamo_compiling():
        # Traced away when compiled; reached only when torch.compile ran this eagerly
        # (compilation disabled, recompile limit hit, ...): flex would build S×S scores.
        raise FlexEagerFallbackError(
            "flex_attention would run uncompiled and materialize the full "
            f"{q.shape[-2]}×{k.shape[-2]} score matrix; torch.compile is disabled or gave up "
            "(TORCHDYNAMO_DISABLE, torch.compiler.disable, recompile limit). Enable compilation "
            "or call attention(..., backend='sdpa')."
        )
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa,
                          return_lse=return_lse, kernel_options=kernel_options)


def _compiled_flex(kernel_options: dict | None):
    """The compiled flex call for one set of kernel options.

    Each options set gets its own copy of the function's code object, so that dynamo's
    per-code recompile limit counts shapes per options set rather than across all of them.
    """
    key = tuple(sorted((kernel_options or {}).items(), key=lambda kv: kv[0]))
    fn = _COMPILED.get(key)
    if fn is None:
        code = _flex_guarded.__code__.replace(co_name=f"_flex_guarded_{len(_COMPILED)}")
        clone = types.FunctionType(code, _flex_guarded.__globals__, code.co_name)
        fn = torch.compile(clone, dynamic=False, fullgraph=True)
        _COMPILED[key] = fn
    return fn


def _call_compiled_flex(q: Tensor, k: Tensor, v: Tensor, block_mask: Any, scale: float, return_lse: bool,
                        kernel_options: dict | None):
    """The compiled flex call; its ``fullgraph=True`` turns Dynamo's recompile limit (each new
    length, mask class or window size compiles anew) into a hard failure, raised here typed."""
    from torch._dynamo import config as dynamo_config
    from torch._dynamo import exc as dynamo_exc

    limit_hit = getattr(dynamo_exc, "FailOnRecompileLimitHit", None) or ()
    try:
        return _compiled_flex(kernel_options)(q, k, v, block_mask, scale, k.shape[1] != q.shape[1], return_lse,
                                              kernel_options)
    except limit_hit as exc:
        raise FlexEagerFallbackError(
            f"compiled flex_attention reached torch._dynamo's recompile limit "
            f"({getattr(dynamo_config, 'recompile_limit', '?')}) at q_len={q.shape[-2]}, kv_len={k.shape[-2]}: "
            "each new length, mask class or window size compiles it again. Raise "
            "torch._dynamo.config.recompile_limit, pad to fewer lengths, or call attention(..., backend='sdpa')."
        ) from exc


def _flex_has_backend_option() -> bool:
    """Whether this torch's flex takes kernel_options['BACKEND'] (it has a FLASH backend)."""
    from torch.nn.attention import flex_attention as fa

    return hasattr(fa, "_Backend")


def _flex_support(device: torch.device, needs_grad: bool, return_lse: bool) -> str | None:
    """None if compiled flex can run here, else the reason it cannot."""
    if not flex_available():
        return f"torch {torch.__version__} has no FlexAttention"
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "FlexAttention on CUDA needs Triton, which is not installed"
        return None
    if device.type == "cpu":
        if needs_grad:
            return "FlexAttention has no backward on CPU (inputs require grad)"
        if return_lse:
            return "compiled FlexAttention on CPU cannot return the LSE"
        return None
    return f"FlexAttention is not supported on device type {device.type!r} here"


def _validate(q: Tensor, k: Tensor, v: Tensor, mask: Mask | None, backend: str) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise AttentionInputError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise AttentionInputError(f"{name} must have shape (B, H, S, D), got {tuple(t.shape)}")
        if not t.dtype.is_floating_point:
            raise AttentionInputError(f"{name} must be floating point, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise AttentionInputError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise AttentionInputError(f"q, k, v devices differ: {q.device}, {k.device}, {v.device}")
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise AttentionInputError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise AttentionInputError(f"k and v must share heads and length, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise AttentionInputError(f"q and k head dims differ: {q.shape[-1]} vs {k.shape[-1]}")
    if q.shape[1] % k.shape[1] != 0:
        raise AttentionInputError(
            f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]}) for GQA")
    if mask is not None and not isinstance(mask, Mask):
        raise AttentionInputError(f"mask must be a kernels.attention.masks.Mask or None, got {type(mask).__name__}")
    if backend not in _BACKENDS:
        raise AttentionInputError(f"backend must be one of {_BACKENDS}, got {backend!r}")


def _is_dense_friendly(mask: Mask | None, q_len: int, kv_len: int) -> bool:
    """Masks SDPA handles without a mask tensor: none/full, or causal on a square problem."""
    return mask is None or isinstance(mask, Full) or (isinstance(mask, Causal) and q_len == kv_len)


def select_backend(q: Tensor, k: Tensor, v: Tensor, mask: Mask | None = None, *,
                   return_lse: bool = False, backend: Backend = "auto") -> str:
    """The backend :func:`attention` would use: 'flex', 'sdpa', 'math' or 'triton_window'."""
    _validate(q, k, v, mask, backend)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    why_not_flex = _flex_support(q.device, needs_grad, return_lse)
    if backend == "flex":
        if why_not_flex is not None:
            raise FlexUnavailableError(why_not_flex)
        return "flex"
    if backend == "sdpa":
        if return_lse:
            raise AttentionInputError("SDPA does not return the LSE; use backend='auto', 'flex' or 'math'")
        return "sdpa"
    if backend == "math":
        return "math"
    causal_window = isinstance(mask, SlidingWindow) and mask.causal
    if backend == "triton_window":
        if not causal_window:
            raise AttentionInputError(
                f"backend='triton_window' computes a causal SlidingWindow mask only, got {mask!r}")
        why = window_unsupported(q, k, v, mask.window)
        if why is not None:
            raise AttentionInputError(why)
        return "triton_window"
    if (causal_window and q.device.type == "cuda" and q.dtype in (torch.bfloat16, torch.float16)
            and q.shape[-1] in WINDOW_TUNED and window_unsupported(q, k, v, mask.window) is None):
        return "triton_window"  # the dedicated kernel, at the head dims it was measured at (faster than flex)
    if _is_dense_friendly(mask, q.shape[2], k.shape[2]) and not return_lse:
        return "sdpa"
    if why_not_flex is None and q.device.type != "cpu":
        # CPU flex (inductor, inference only) is opt-in: torch 2.13's compiled CPU kernel gave
        # wrong rows / NaN for some short lengths (S = 8, 24 with a causal window of 6) and
        # compiles for seconds per shape, so 'auto' does not pick it there.
        return "flex"
    return "math" if return_lse else "sdpa"


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Mask | None, scale: float) -> Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = aligned(q), aligned(k), aligned(v)  # see layout.aligned: a misaligned base gave wrong values
    group = q.shape[1] // k.shape[1]
    kwargs: dict[str, Any] = {"scale": scale}
    if mask is None or isinstance(mask, Full):
        attn_mask = None
    elif isinstance(mask, Causal) and q.shape[2] == k.shape[2]:
        attn_mask = None
        kwargs["is_causal"] = True
    else:
        attn_mask = mask.dense(q.shape[2], k.shape[2], batch=q.shape[0], heads=q.shape[1],
                               device=q.device)
    if group > 1:
        if attn_mask is None:
            kwargs["enable_gqa"] = True
        else:  # the kernels that take an arbitrary mask do not all take GQA: expand k/v
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
    if q.device.type == "cuda" and torch.are_deterministic_algorithms_enabled():
        # flash's backward accumulates dQ with atomics; these two honour determinism
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kwargs)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kwargs)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | None = None,
    *,
    scale: float | None = None,
    return_lse: bool = False,
    backend: Backend = "auto",
    kernel_options: dict[str, Any] | None = None,
    block_size: int | tuple[int, int] = 128,
    cache: BlockMaskCache | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Masked scaled-dot-product attention.

    Args:
        q: (B, Hq, Sq, D) queries. k, v: (B, Hkv, Skv, D) / (B, Hkv, Skv, Dv); Hq must be a
            multiple of Hkv (grouped-query attention: query head ``h`` reads kv head ``h // (Hq/Hkv)``).
        mask: a :class:`~kernels.attention.masks.Mask` (None: every pair).
        scale: score scale, default ``1/sqrt(D)``.
        return_lse: also return the log-sum-exp of the scaled scores, (B, Hq, Sq) float32, natural log.
        backend: 'auto' (see module doc), 'flex' (raise if it cannot run), 'sdpa', 'math'
            (the chunked reference), or 'triton_window' (the dedicated causal sliding-window
            kernel; float16, bfloat16 or float32 on CUDA, float16 or float32 on CPU under
            ``TRITON_INTERPRET=1``).
        kernel_options: passed to ``flex_attention`` (e.g. ``{"BLOCK_M": 64, "BLOCK_N": 64}``).
        block_size: the block mask's sparse block size (int or (q, kv) pair).
        cache: block-mask cache (default: the process-wide one).

    Returns:
        out (B, Hq, Sq, Dv) in q's dtype, or ``(out, lse)`` when ``return_lse``.
    """
    chosen = select_backend(q, k, v, mask, return_lse=return_lse, backend=backend)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise AttentionInputError(f"scale must be a real number or None, got {type(scale).__name__}")
    if cache is not None and not isinstance(cache, BlockMaskCache):
        raise AttentionInputError(f"cache must be a BlockMaskCache or None, got {type(cache).__name__}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if chosen == "sdpa":
        return _sdpa(q, k, v, mask, scale)
    if chosen == "math":
        out, lse = math_attention(q, k, v, mask, scale=scale)
        return (out, lse) if return_lse else out
    if chosen == "triton_window":
        assert isinstance(mask, SlidingWindow)
        out, lse = window_attention(q, k, v, mask.window, scale=scale, return_lse=return_lse)
        return (out, lse) if return_lse else out
    mask = Full() if mask is None else mask
    bm = (cache if cache is not None else default_cache).get(mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2],
                                      q.device, block_size)
    opts = dict(kernel_options or {})
    if torch.are_deterministic_algorithms_enabled() and _flex_has_backend_option():
        opts.setdefault("BACKEND", "TRITON")  # its backward has no atomics without score_mod grads
    # traced already (a caller's torch.compile): flex is called in that graph, no compiled wrapper
    if torch.compiler.is_compiling():
        result = _flex_guarded(q, k, v, bm, scale, k.shape[1] != q.shape[1], return_lse, opts or None)
    else:
        result = _call_compiled_flex(q, k, v, bm, scale, return_lse, opts or None)
    if return_lse:
        out, lse = result
        return out, lse.float()
    return result
