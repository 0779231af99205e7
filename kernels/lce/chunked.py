"""Chunked driver: one chunk of rows at a time, never more than one chunk of logits.

Per chunk: logits = x_c @ W^T (+ b) into a reused buffer, a row pass (PyTorch ops or the
Triton kernel) turns them into loss terms and, in place, into d(loss)/d(logits), and three
matrix products finish the job: dx_c = dlogits @ W, dW += dlogits^T @ x_c, db += sum(dlogits).
dW and db accumulate in ``accum_dtype`` (float32 by default) across chunks; nothing on the
way forces a host synchronisation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import LossConfig
from .rowwise import RowPass

#: default memory budget of the chunk's logits buffer on CUDA and on the CPU
CUDA_CHUNK_BYTES = 256 * 2**20
#: on CUDA when a weight-sized float32 dW accumulator is held anyway (bf16/fp16 weights with
#: accum_dtype=float32): larger chunks mean fewer passes over that accumulator
CUDA_WIDE_ACCUM_CHUNK_BYTES = 512 * 2**20
CPU_CHUNK_BYTES = 64 * 2**20  # 512 rows at V=32768 fp32: 4x faster than 128 rows on 2 cores, measured
#: input dtypes whose matrix products accumulate in float32 (cuBLAS, and PyTorch's CPU kernels)
_HALF = (torch.bfloat16, torch.float16)


@dataclass
class ChunkedResult:
    """Per-row loss terms over all rows, and the gradients asked for (else ``None``)."""

    nll: torch.Tensor
    smooth: torch.Tensor
    lse_sq: torch.Tensor
    grad_input: torch.Tensor | None = None
    grad_weight: torch.Tensor | None = None
    grad_bias: torch.Tensor | None = None


def default_chunk_size(
    num_rows: int,
    num_classes: int,
    dtype: torch.dtype,
    device: torch.device,
    accumulator_bytes: int = 0,
) -> int:
    """Rows per chunk: the largest multiple of 64 (at least 64) whose logits fit the budget.

    ``accumulator_bytes``: the weight-sized float32 dW accumulator that many chunks would need
    (0: none). On CUDA, when all rows' logits take no more memory than it, one chunk of every
    row is returned: one product then accumulates all of dW in float32 inside the matrix unit
    and rounds once, so the accumulator, its passes and its final conversion are not needed;
    otherwise a held accumulator raises the budget (fewer passes over it)."""
    elem = torch.empty((), dtype=dtype).element_size()
    if device.type == "cuda" and accumulator_bytes and num_rows * num_classes * elem <= accumulator_bytes:
        return max(1, num_rows)
    if device.type == "cuda":
        budget = CUDA_WIDE_ACCUM_CHUNK_BYTES if accumulator_bytes else CUDA_CHUNK_BYTES
    else:
        budget = CPU_CHUNK_BYTES
    if device.type != "cuda":
        elem = max(elem, 4)  # the CPU row pass works on a float32 copy
    rows = budget // max(1, num_classes * elem)
    rows = max(64, rows // 64 * 64)
    return max(1, min(rows, num_rows))


def _mixed_addmm_supported(device: torch.device) -> bool:
    """Whether ``torch.addmm(..., out_dtype=float32)`` (bf16/fp16 in, fp32 out) works here."""
    key = str(device)
    if key not in _MIXED_ADDMM:
        try:
            a = torch.ones(2, 2, dtype=torch.bfloat16, device=device)
            acc = torch.ones(2, 2, dtype=torch.float32, device=device)
            torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
            _MIXED_ADDMM[key] = bool(acc[0, 0].item() == 3.0)
        except (RuntimeError, TypeError, NotImplementedError):
            _MIXED_ADDMM[key] = False
    return _MIXED_ADDMM[key]


_MIXED_ADDMM: dict[str, bool] = {}  # capability registry, filled once per device


#: On CUDA, an accumulating product (``acc += a @ b``, beta = 1) is made as this many products
#: over blocks of the output's columns. Measured on an H200 (cuBLAS, torch 2.11) at the
#: N=16384 / 256 MiB chunk shape, dW (128256 x 4096, bf16) += (128256 x 1024) @ (1024 x 4096):
#: 1.691 / 1.793 ms in two calls against 1.946 / 1.891 whole; four blocks 1.797, eight 1.910
#: (``docs/bench/lce.md``, the products' splits). The first product (beta = 0) is made whole.
ACCUMULATE_COLUMN_BLOCKS = 2
#: narrowest block a split leaves (a multiple of 128, cuBLAS's widest tile)
MIN_BLOCK_COLUMNS = 1024


def column_blocks(cols: int, blocks: int) -> list[slice]:
    """At most ``blocks`` slices covering ``cols`` columns, each a multiple of 128 wide but the
    last and none narrower than :data:`MIN_BLOCK_COLUMNS` (fewer blocks where they would be)."""
    blocks = min(blocks, cols // MIN_BLOCK_COLUMNS)
    if blocks <= 1:
        return [slice(0, cols)]
    width = -(-cols // blocks)
    width = -(-width // 128) * 128
    return [slice(s, min(s + width, cols)) for s in range(0, cols, width)]


def _accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, first: bool,
                blocks: int | None = None) -> None:
    """``acc (=|+=) a @ b`` with ``acc`` possibly wider than ``a``/``b``; an accumulating
    product is made over ``blocks`` column blocks (default: :data:`ACCUMULATE_COLUMN_BLOCKS`
    on CUDA, 1 elsewhere)."""
    mixed = acc.dtype != a.dtype
    if mixed and not (acc.device.type == "cuda" and acc.dtype == torch.float32 and _mixed_addmm_supported(acc.device)):
        a, b, mixed = a.to(acc.dtype), b.to(acc.dtype), False
    if blocks is None:
        blocks = ACCUMULATE_COLUMN_BLOCKS if acc.device.type == "cuda" else 1
    for cols in column_blocks(acc.shape[1], 1 if first else blocks):
        out, right = acc[:, cols], b[:, cols]  # the whole width is a view of the same strides
        if mixed:
            torch.addmm(out, a, right, out_dtype=torch.float32, beta=0.0 if first else 1.0, out=out)
        elif first:
            torch.mm(a, right, out=out)
        else:
            out.addmm_(a, right)


def chunked_linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    cfg: LossConfig,
    class_weight: torch.Tensor | None,
    coefs: torch.Tensor,
    row_pass: RowPass,
    *,
    chunk_size: int,
    need_input_grad: bool = False,
    need_weight_grad: bool = False,
    need_bias_grad: bool = False,
    row_scale: torch.Tensor | None = None,
    accum_dtype: torch.dtype = torch.float32,
) -> ChunkedResult:
    """Loss terms for ``x [N, H]``, ``weight [C, H]``, ``target [N]``, and optionally gradients.

    Gradients are those of ``sum_i row_scale_i * loss_i`` where ``loss_i`` is row i's
    contribution to the reduced loss (see :func:`config.reduction_coefficients`). A weight
    wider than ``x`` (a float32 master weight under autocast) is multiplied through a copy in
    ``x``'s dtype; its gradient accumulates in (at least) the weight's own dtype.
    """
    n, _ = x.shape
    num_classes = weight.shape[0]
    ct = coefs.dtype
    want_grad = need_input_grad or need_weight_grad or need_bias_grad
    nll = torch.empty(n, dtype=ct, device=x.device)
    smooth = torch.empty_like(nll)
    lse_sq = torch.empty_like(nll)
    result = ChunkedResult(nll, smooth, lse_sq)
    if need_input_grad:
        result.grad_input = torch.empty_like(x)
    dw_acc = db_acc = None
    chunk_size = max(1, min(chunk_size, n)) if n else 1
    if need_weight_grad:
        dw_dtype = torch.promote_types(accum_dtype, weight.dtype)
        if n <= chunk_size and accum_dtype == torch.float32 and x.dtype == weight.dtype and x.dtype in _HALF:
            # one chunk: the one product accumulates in float32 and rounds once, which is what a
            # float32 accumulator rounded at the end would give, without the weight-sized buffer
            dw_dtype = weight.dtype
        dw_acc = torch.empty(weight.shape, dtype=dw_dtype, device=x.device)
    if need_bias_grad:
        db_acc = torch.empty(num_classes, dtype=torch.promote_types(accum_dtype, bias.dtype), device=x.device)

    buffer = torch.empty((chunk_size, num_classes), dtype=x.dtype, device=x.device) if n else None
    w_mm = weight if weight.dtype == x.dtype else weight.to(x.dtype)
    w_t = w_mm.t()
    for index, start in enumerate(range(0, n, chunk_size)):
        stop = min(start + chunk_size, n)
        x_c = x[start:stop]
        logits = buffer[: stop - start]
        if bias is not None:
            torch.addmm(bias, x_c, w_t, out=logits)
        else:
            torch.mm(x_c, w_t, out=logits)
        rows = row_pass(
            logits,
            target[start:stop],
            cfg,
            class_weight,
            coefs,
            row_scale[start:stop] if row_scale is not None else None,
            want_grad,
        )
        nll[start:stop] = rows.nll
        smooth[start:stop] = rows.smooth
        lse_sq[start:stop] = rows.lse_sq
        if not want_grad:
            continue
        g = rows.grad
        first = index == 0
        if need_input_grad:
            torch.mm(g, w_mm, out=result.grad_input[start:stop])
        if need_weight_grad:
            _accumulate(dw_acc, g.t(), x_c, first)
        if need_bias_grad:
            part = g.sum(dim=0, dtype=db_acc.dtype)
            if first:
                db_acc.copy_(part)
            else:
                db_acc.add_(part)

    if n == 0:  # degenerate batch: gradients are exactly zero
        if dw_acc is not None:
            dw_acc.zero_()
        if db_acc is not None:
            db_acc.zero_()
    if dw_acc is not None:
        result.grad_weight = dw_acc if dw_acc.dtype == weight.dtype else dw_acc.to(weight.dtype)
    if db_acc is not None:
        result.grad_bias = db_acc if db_acc.dtype == bias.dtype else db_acc.to(bias.dtype)
    return result
