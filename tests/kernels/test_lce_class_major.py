"""The class-major layout of the fused loss: the logits held inside the weight gradient's buffer.

The layout arithmetic is checked directly; the driver and its Triton column pass run under
Triton's CPU interpreter (a subprocess, ``tests.helpers.triton_interpreter``) against the
float64 reference, over shapes with several dW slabs and tokens fewer, equal and more than H.
"""
from __future__ import annotations

import random

import pytest
import torch

from kernels.lce.class_major import (
    SLAB_ROWS,
    class_major_grad_dtype,
    class_major_slab_rows,
    slab_layout,
)
from tests.helpers.triton_interpreter import HAS_TRITON, assert_runs_interpreted


def _overlaps(layout, n: int, h: int, c: int, le: int, ge: int) -> list[int]:
    """Slabs whose dW bytes reach logits bytes of the same or a later slab."""
    bad = []
    for s, first in enumerate(range(0, c, layout.slab_rows)):
        out = (first * h * ge, min(first + layout.slab_rows, c) * h * ge)
        unread = (layout.logits_offset + first * n * le, layout.logits_offset + c * n * le)
        if out[0] < unread[1] and unread[0] < out[1]:
            bad.append(s)
    return bad


def test_slab_layout_never_writes_a_slab_over_logits_not_yet_read():
    rng = random.Random()
    for _ in range(400):
        n, h, c = rng.randint(1, 300), rng.randint(1, 300), rng.randint(1, 3000)
        le, ge, rows = rng.choice((2, 4)), rng.choice((2, 4)), rng.randint(1, 700)
        layout = slab_layout(n, h, c, le, ge, rows)
        assert not _overlaps(layout, n, h, c, le, ge), (n, h, c, le, ge, rows)
        assert layout.logits_offset % 256 == 0
        assert layout.total_bytes >= max(c * h * ge, layout.logits_offset + c * n * le)
        assert layout.grad_bytes == c * h * ge


def test_slab_layout_offset_is_the_smallest_aligned_one():
    for n, h, c, le, ge, rows in ((4096, 4096, 128256, 2, 2, 4096), (333, 96, 1003, 4, 4, 64), (50, 700, 999, 2, 4, 100)):
        layout = slab_layout(n, h, c, le, ge, rows)
        tighter = type(layout)(rows, layout.logits_offset - 256, layout.total_bytes, layout.grad_bytes)
        assert _overlaps(tighter, n, h, c, le, ge)


def test_few_tokens_fit_in_the_weight_gradient_with_a_small_tail():
    # N = H = 4096, V = 128256, bf16: 8192-class slabs leave a 64 MiB tail (N rows of one slab)
    layout = slab_layout(4096, 4096, 128256, 2, 2, 8192)
    assert layout.extra_bytes == 4096 * 8192 * 2
    assert class_major_slab_rows(4096, 4096, 128256, 2, 2) == 8192
    assert class_major_slab_rows(4096, 4096, 128256, 2, 2, budget=20 * 2**20) == 2048
    # a float32 master weight's gradient holds twice the tokens
    assert class_major_slab_rows(8192, 4096, 128256, 2, 4) == 4096
    # more tokens than the buffer takes: row chunks
    assert class_major_slab_rows(16384, 4096, 128256, 2, 2) == 0
    assert class_major_slab_rows(0, 4096, 128256, 2, 2) == 0
    assert max(SLAB_ROWS) == SLAB_ROWS[0]


def test_class_major_gradient_dtype_rounds_once_or_declines():
    bf16, f16, f32, f64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
    assert class_major_grad_dtype(bf16, bf16, f32) == bf16  # one product per slab: fp32 inside, one rounding
    assert class_major_grad_dtype(bf16, bf16, bf16) == bf16
    assert class_major_grad_dtype(f16, f16, f32) == f16
    assert class_major_grad_dtype(f32, f32, f32) == f32
    assert class_major_grad_dtype(bf16, f32, f32) == f32  # master weight under autocast
    assert class_major_grad_dtype(bf16, bf16, f64) is None
    assert class_major_grad_dtype(f64, f64, f64) is None


DRIVER_SCRIPT = r'''
import random, torch
from kernels.lce import linear_cross_entropy, reference_linear_cross_entropy, LossConfig
from kernels.lce.class_major import class_major_linear_cross_entropy, slab_layout, SlabLayout
import kernels.lce.class_major as cm
from kernels.lce.column_kernels import triton_column_pass
from kernels.lce.config import reduction_coefficients
seed = random.SystemRandom().randrange(2**31); torch.manual_seed(seed)

def rel(a, b):
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-30))

def reference(x, w, t, b, cfg, cw, g):
    leaves = [p.detach().double().requires_grad_() for p in (x, w) + ((b,) if b is not None else ())]
    ref, _ = reference_linear_cross_entropy(leaves[0], leaves[1], t, leaves[2] if b is not None else None, cfg,
                                            cw.double() if cw is not None else None)
    return ref, torch.autograd.grad(ref, leaves, g)

worst = {torch.float32: 0.0, torch.bfloat16: 0.0}
# tokens fewer than, equal to and more than H; several slabs (V not a multiple of the slab)
SHAPES = [(9, 24, 37, 8), (16, 16, 50, 16), (40, 8, 29, 5), (7, 32, 130, 128)]
CASES = [("mean", {"label_smoothing": 0.2, "z_loss": 1e-3, "softcap": 3.0}, True, True),
         ("sum", {"label_smoothing": 0.1}, False, True), ("none", {"z_loss": 1e-2}, True, False), ("mean", {}, False, False)]
for (n, h, v, slab), (reduction, kw, use_cw, use_b) in zip(SHAPES * 2, CASES * 2):
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(n, h).to(dtype); w = (torch.randn(v, h) * h**-0.5).to(dtype)
        b = (torch.randn(v) * 0.1).to(dtype) if use_b else None
        t = torch.randint(0, v, (n,)); t[::3] = -100
        cw = torch.rand(v) + 0.5 if use_cw else None
        cfg = LossConfig(reduction, -100, kw.get("label_smoothing", 0.0), kw.get("z_loss", 0.0), kw.get("softcap"))
        coefs = reduction_coefficients(cfg, t, cw, v, torch.float32)
        g = torch.randn(n if reduction == "none" else (), dtype=torch.float64)
        # the driver alone, with small slabs: gradients of sum_i g_i * loss_i
        scale = g.float().reshape(-1).expand(n).contiguous() if reduction == "none" else None
        res = class_major_linear_cross_entropy(x, w, t, b, cfg, cw, coefs, triton_column_pass, slab_rows=slab,
                                               grad_dtype=dtype, need_input_grad=True, need_bias_grad=use_b,
                                               row_scale=scale)
        ref, ref_grads = reference(x, w, t, b, cfg, cw, g)
        got = [res.grad_input, res.grad_weight] + ([res.grad_bias] if use_b else [])
        if reduction != "none":
            got = [gr * g.float().to(gr.dtype) for gr in got]
        for a, r in zip(got, ref_grads):
            worst[dtype] = max(worst[dtype], rel(a, r))
        assert res.grad_weight.untyped_storage().nbytes() >= slab_layout(n, h, v, x.element_size(), x.element_size(), slab).total_bytes
        # the public entry takes the layout by default (chunk_size unset) and autograd keeps its buffer
        leaves = [p.clone().requires_grad_() for p in (x, w) + ((b,) if use_b else ())]
        out = linear_cross_entropy(leaves[0], leaves[1], t, leaves[2] if use_b else None, reduction=reduction,
                                   class_weight=cw, implementation="triton", **kw)
        out.backward(g.to(out.dtype))
        worst[dtype] = max(worst[dtype], rel(out.detach(), ref))
        for p, r in zip(leaves, ref_grads):
            worst[dtype] = max(worst[dtype], rel(p.grad, r))
        assert leaves[1].grad.untyped_storage().nbytes() > v * h * x.element_size(), "row chunks were taken"

# logits starting 1 KiB too early are overwritten by earlier slabs before they are read: dW
# comes out wrong, so the checks above can fail (an exact alias of a slab's own input, which
# the CPU's mm survives, is not the case made here)
n, h, v, slab = 9, 24, 37, 8
x = torch.randn(n, h); w = torch.randn(v, h) * 0.25; t = torch.randint(0, v, (n,))
cfg = LossConfig("sum"); coefs = reduction_coefficients(cfg, t, None, v, torch.float32)
good = slab_layout(n, h, v, 4, 4, slab)
cm.slab_layout = lambda *a: SlabLayout(slab, good.logits_offset - 1024, good.total_bytes, good.grad_bytes)
res = class_major_linear_cross_entropy(x, w, t, None, cfg, None, coefs, triton_column_pass, slab_rows=slab,
                                       grad_dtype=torch.float32)
_, ref_grads = reference(x, w, t, None, cfg, None, torch.ones((), dtype=torch.float64))
assert rel(res.grad_weight, ref_grads[1]) > 1e-3
print("seed", seed, "worst", worst)
assert worst[torch.float32] <= 1e-5 and worst[torch.bfloat16] <= 1e-2, worst
print("ok")
'''


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_class_major_driver_and_column_pass_match_float64_reference_under_interpreter():
    assert_runs_interpreted(DRIVER_SCRIPT)


ROUTE_SCRIPT = r'''
import torch
from kernels.lce import linear_cross_entropy
n, h, v = 12, 16, 40
x = torch.randn(n, h, requires_grad=True); w = torch.randn(v, h, requires_grad=True); t = torch.randint(0, v, (n,))
def storage_of_dw(**kw):
    w.grad = None
    linear_cross_entropy(x, w, t, implementation="triton", **kw).backward()
    return w.grad.untyped_storage().nbytes()
plain = v * h * 4
assert storage_of_dw() > plain                      # class-major by default
assert storage_of_dw(chunk_size=5) == plain          # an explicit chunk size keeps row chunks
assert storage_of_dw(accum_dtype=torch.float64) == plain  # float64 accumulation: row chunks
w.requires_grad_(False)                               # no weight gradient: nothing to hold logits in
gx, = torch.autograd.grad(linear_cross_entropy(x, w, t, implementation="triton"), x)
assert gx.shape == x.shape
print("ok")
'''


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_class_major_is_the_default_only_where_it_applies():
    assert_runs_interpreted(ROUTE_SCRIPT)
