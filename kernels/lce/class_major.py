"""Class-major driver: every token's logits at once, held inside the weight gradient's own buffer.

When the weight gradient is wanted it is a ``C x H`` output the call has to allocate anyway.
When there are few tokens (``N`` up to about ``H``), all ``C x N`` logits fit in that buffer
plus a small tail, so no logits buffer and no chunking are needed:

1. ``logits^T = W @ x^T`` (+ b) is written class-major into the end of the buffer;
2. the column pass (``column_kernels.py``) turns it, in place, into ``dlogits^T`` and the
   per-token loss terms;
3. ``dx = dlogits @ W`` and ``db = dlogits.sum(0)`` read it whole;
4. ``dW`` is written from the front in slabs of classes: slab ``s`` is one product over all
   tokens, ``dW[s] = dlogits^T[s] @ x``, and lands only on bytes whose logits earlier slabs
   have consumed (the logits start far enough into the buffer for that; the products run in
   stream order).

So each dW element is one product over every token, accumulated in float32 and rounded once
(bf16/fp16 weights), with no accumulator and no pass over dW per chunk of rows; the call's
memory beyond its gradients is the tail (``slab_layout``) and a few per-token vectors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .chunked import _HALF, ChunkedResult, _accumulate, _mixed_addmm_supported
from .config import LossConfig
from .rowwise import RowPass

#: the tail beyond the weight gradient that the class-major layout may take on CUDA
CUDA_CLASS_MAJOR_EXTRA_BYTES = 64 * 2**20
#: classes per dW slab, largest first (each slab is one product with K = all tokens)
SLAB_ROWS = (8192, 4096, 2048, 1024, 512)
_ALIGN = 256


@dataclass(frozen=True)
class SlabLayout:
    """Where the logits sit in the gradient buffer: ``slab_rows`` classes per dW slab, the
    logits' byte offset and the buffer's total bytes (the weight gradient is its first bytes)."""

    slab_rows: int
    logits_offset: int
    total_bytes: int
    grad_bytes: int

    @property
    def extra_bytes(self) -> int:
        """Bytes beyond the weight gradient."""
        return self.total_bytes - self.grad_bytes


def slab_layout(n: int, h: int, c: int, logit_elem: int, grad_elem: int, slab_rows: int) -> SlabLayout:
    """The smallest logits offset for which slab ``s``'s output bytes never reach the logits of
    slab ``s`` or later: ``end(dW[s]) <= offset + start(logits[s])`` for every slab."""
    offset = 0
    for first in range(0, c, slab_rows):
        out_end = min(first + slab_rows, c) * h * grad_elem
        offset = max(offset, out_end - first * n * logit_elem)
    offset = -(-offset // _ALIGN) * _ALIGN
    grad_bytes = c * h * grad_elem
    return SlabLayout(slab_rows, offset, max(grad_bytes, offset + c * n * logit_elem), grad_bytes)


def class_major_grad_dtype(x_dtype: torch.dtype, weight_dtype: torch.dtype,
                           accum_dtype: torch.dtype) -> torch.dtype | None:
    """The weight gradient's dtype in the class-major layout, or ``None`` where it does not apply.

    Each slab is one product over all tokens, so a bf16/fp16 weight's gradient is accumulated in
    float32 and rounded once whether ``accum_dtype`` is float32 or the input dtype; a float32
    master weight under autocast gets a float32 gradient (its slabs need mixed-precision
    products: :func:`class_major_runs_here`); float64 accumulation of lower-precision products
    is left to the row chunks."""
    if x_dtype == weight_dtype:
        if x_dtype in _HALF and accum_dtype in (torch.float32, x_dtype):
            return weight_dtype
        if x_dtype == torch.float32 and accum_dtype == torch.float32:
            return weight_dtype
        return None
    if weight_dtype == torch.float32 and x_dtype in _HALF and accum_dtype == torch.float32:
        return torch.float32
    return None


def class_major_runs_here(x: torch.Tensor, grad_dtype: torch.dtype) -> bool:
    """Whether this device computes ``x``-dtype products into ``grad_dtype`` slabs."""
    return grad_dtype == x.dtype or _mixed_addmm_supported(x.device)


def class_major_slab_rows(n: int, h: int, c: int, logit_elem: int, grad_elem: int,
                          budget: int = CUDA_CLASS_MAJOR_EXTRA_BYTES) -> int:
    """Classes per dW slab of the class-major layout whose tail fits ``budget`` (the largest of
    ``SLAB_ROWS`` that does), or 0 when none fits (then the call takes row chunks)."""
    if n < 1 or c < 1:
        return 0
    for rows in SLAB_ROWS:
        if slab_layout(n, h, c, logit_elem, grad_elem, rows).extra_bytes <= budget:
            return rows
    return 0


def class_major_linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    cfg: LossConfig,
    class_weight: torch.Tensor | None,
    coefs: torch.Tensor,
    column_pass: RowPass,
    *,
    slab_rows: int,
    grad_dtype: torch.dtype,
    need_input_grad: bool = False,
    need_bias_grad: bool = False,
    row_scale: torch.Tensor | None = None,
    accum_dtype: torch.dtype = torch.float32,
) -> ChunkedResult:
    """Loss terms and gradients (dW always; dX, db as asked) of ``x [N, H]``, ``weight [C, H]``,
    ``target [N]``, with the same contract as :func:`chunked.chunked_linear_cross_entropy`.

    ``column_pass`` has the row pass's contract on class-major logits (``[C, N]``, the gradient
    written in place); the returned weight gradient is a view of the front of the buffer."""
    n, h = x.shape
    c = weight.shape[0]
    if n < 1:
        raise ValueError("the class-major layout needs at least one token")
    grad_elem = grad_dtype.itemsize
    layout = slab_layout(n, h, c, x.element_size(), grad_elem, slab_rows)
    buffer = torch.empty(-(-layout.total_bytes // grad_elem), dtype=grad_dtype, device=x.device)
    grad_weight = buffer[: c * h].view(c, h)
    logits_t = (buffer.view(torch.uint8)[layout.logits_offset: layout.logits_offset + c * n * x.element_size()]
                .view(x.dtype).view(c, n))
    w_mm = weight if weight.dtype == x.dtype else weight.to(x.dtype)
    if bias is not None:
        torch.addmm(bias.unsqueeze(1), w_mm, x.t(), out=logits_t)
    else:
        torch.mm(w_mm, x.t(), out=logits_t)
    rows = column_pass(logits_t, target, cfg, class_weight, coefs, row_scale, True)
    result = ChunkedResult(rows.nll, rows.smooth, rows.lse_sq)
    if need_input_grad:
        result.grad_input = torch.mm(logits_t.t(), w_mm)
    if need_bias_grad:
        db = logits_t.sum(dim=1, dtype=torch.promote_types(accum_dtype, bias.dtype))
        result.grad_bias = db if db.dtype == bias.dtype else db.to(bias.dtype)
    for first in range(0, c, slab_rows):  # front to back: each slab lands on consumed logits only
        last = min(first + slab_rows, c)
        _accumulate(grad_weight[first:last], logits_t[first:last], x, first=True)
    result.grad_weight = grad_weight
    return result
