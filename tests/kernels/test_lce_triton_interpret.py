"""The Triton row kernel, run by Triton's CPU interpreter (no GPU needed; skipped without triton).

Runs in a subprocess (``tests.helpers.triton_interpreter``).
"""
from __future__ import annotations

import pytest

from tests.helpers.triton_interpreter import HAS_TRITON, assert_runs_interpreted

SCRIPT = r'''
import random, torch, torch.nn.functional as F
from kernels.lce import linear_cross_entropy, reference_linear_cross_entropy, LossConfig
seed = random.SystemRandom().randrange(2**31); torch.manual_seed(seed)
worst = 0.0
CASES = [("mean", {"label_smoothing": 0.2, "z_loss": 1e-3, "softcap": 3.0}, True),
         ("none", {}, False), ("sum", {"label_smoothing": 0.1}, False)]
for reduction, kw, use_cw in CASES:
    if True:
        if True:
            n, h, v = 13, 8, 37
            x = torch.randn(n, h, requires_grad=True); w = torch.randn(v, h, requires_grad=True)
            b = torch.randn(v, requires_grad=True)
            t = torch.randint(0, v, (n,)); t[::4] = -100
            cw = torch.rand(v) + 0.5 if use_cw else None
            out = linear_cross_entropy(x, w, t, b, reduction=reduction, class_weight=cw, chunk_size=8,
                                       implementation="triton", **kw)
            g = torch.randn(out.shape, dtype=torch.float64)
            grads = torch.autograd.grad(out, (x, w, b), g.float())
            leaves = [p.detach().double().requires_grad_() for p in (x, w, b)]
            cfg = LossConfig(reduction, -100, kw.get("label_smoothing", 0.0), kw.get("z_loss", 0.0), kw.get("softcap"))
            ref, _ = reference_linear_cross_entropy(leaves[0], leaves[1], t, leaves[2], cfg,
                                                    cw.double() if cw is not None else None)
            ref_grads = torch.autograd.grad(ref, leaves, g)
            for a, r in zip((out, *grads), (ref, *ref_grads)):
                worst = max(worst, float((a.double() - r).norm() / r.norm()))
print("seed", seed, "worst", worst)
assert worst <= 1e-5, worst
'''


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_row_kernel_under_interpreter_matches_float64_reference():
    assert_runs_interpreted(SCRIPT, expect=None)


SCALE_SCRIPT = r'''
import torch
from kernels.lce.triton_kernels import triton_scale_
for dtype in (torch.float64, torch.float32, torch.bfloat16):
    for value in (1.0, 0.37, -2.0, 0.0):
        g = torch.randn(10_000, dtype=torch.float32).to(dtype)  # more than one 8192-element block
        want = g.clone().mul_(torch.tensor(value).to(dtype))
        triton_scale_(g, torch.tensor(value))
        if dtype != torch.bfloat16 or value == 1.0:  # float64 once went through float32 math
            assert torch.equal(g, want), (dtype, value)
        else:  # the interpreter's float32 -> bfloat16 rounding may differ from torch's by one unit
            assert ((g.float() - want.float()).abs() <= want.float().abs() * 2**-7).all(), (dtype, value)
print("ok")
'''


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_device_side_gradient_scaling_rounds_like_mul_and_skips_a_unit_scale():
    assert_runs_interpreted(SCALE_SCRIPT)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_device_side_gradient_scaling_refuses_what_it_cannot_scale_in_place():
    import torch

    from kernels.lce.triton_kernels import triton_scale_

    with pytest.raises(ValueError, match="contiguous tensor and a one-element scale"):
        triton_scale_(torch.ones(4, 6).t(), torch.ones(()))
    with pytest.raises(ValueError, match="contiguous tensor and a one-element scale"):
        triton_scale_(torch.ones(8), torch.ones(2))
