"""CPU tests of the fused linear + cross-entropy loss (reference and chunked implementations).

Every case draws fresh random inputs (the seed is in the failure message) and compares the
loss and the input/weight/bias gradients against a float64 reference: fp32 within 1e-5
relative, bf16 within 1e-2. The reference itself is checked against ``F.cross_entropy``.
"""
from __future__ import annotations

import math
import random
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from kernels.lce import (
    BackwardTwiceError,
    LCEDeviceError,
    LCETypeError,
    LCEValueError,
    LinearCrossEntropyLoss,
    LossConfig,
    UnsupportedFeatureError,
    linear_cross_entropy,
    reference_linear_cross_entropy,
    select_implementation,
)
from kernels.lce.triton_kernels import triton_usable

TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 1e-2}
FEATURES = {
    "plain": {},
    "smoothing": {"label_smoothing": 0.15},
    "class_weight": {"class_weight": True},
    "z_loss": {"z_loss": 1e-3},
    "softcap": {"softcap": 3.0},
    "bias": {"bias": True},
    "smoothing+weight": {"label_smoothing": 0.3, "class_weight": True},
    "all": {"label_smoothing": 0.2, "class_weight": True, "z_loss": 1e-2, "softcap": 2.5, "bias": True},
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    if torch.isnan(b).any():
        return 0.0 if torch.equal(torch.isnan(a), torch.isnan(b)) and torch.allclose(a[~a.isnan()], b[~b.isnan()]) else math.inf
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _bias_grad_terms(x, w, b, t, cw, reduction, kw, grad_out) -> float:
    """``|| sum_rows |dlogits| ||`` in float64: the size of the terms dbias sums. The sum cancels
    (each row's terms add up to zero over the classes when the targets sum to one), so dbias can
    be far smaller than its terms, and bf16 logits' rounding is then large against dbias itself:
    its error is measured against this scale (``_rel_to``)."""
    logits = F.linear(x.double(), w.double(), b.double() if b is not None else None).requires_grad_()
    cfg = LossConfig(reduction, -100, kw.get("label_smoothing", 0.0), kw.get("z_loss", 0.0), kw.get("softcap"))
    eye = torch.eye(w.shape[0], dtype=torch.float64)  # logits @ I^T: the reference on these logits
    loss, _ = reference_linear_cross_entropy(logits, eye, t if not t.is_floating_point() else t.double(), None, cfg, cw)
    (g,) = torch.autograd.grad(loss, logits, grad_out)
    return float(g.abs().sum(0).norm())


def _rel_to(a: torch.Tensor, b: torch.Tensor, scale: float) -> float:
    """``||a - b||`` relative to ``scale`` (at least ``||b||``)."""
    return float((a.detach().double() - b.detach().double()).norm()) / max(scale, float(b.detach().double().norm()), 1e-300)


def _fresh_seed() -> int:
    seed = random.SystemRandom().randrange(2**31)
    torch.manual_seed(seed)
    return seed


def _draw(dtype, feats, n=None, h=None, v=None, ignore_frac=0.15):
    n = n if n is not None else int(torch.randint(1, 150, ()))
    h = h if h is not None else int(torch.randint(4, 40, ()))
    v = v if v is not None else int(torch.randint(2, 300, ()))
    x = (torch.randn(n, h, dtype=torch.float64) * 0.7).to(dtype)
    w = (torch.randn(v, h, dtype=torch.float64) * 0.5).to(dtype)
    b = (torch.randn(v, dtype=torch.float64) * 0.2).to(dtype) if feats.get("bias") else None
    t = torch.randint(0, v, (n,))
    t[torch.rand(n) < ignore_frac] = -100
    cw = torch.rand(v, dtype=torch.float64) + 0.25 if feats.get("class_weight") else None
    return x, w, b, t, cw


def _kw(feats):
    return {k: feats[k] for k in ("label_smoothing", "z_loss", "softcap") if k in feats}


def _run(impl, x, w, b, t, cw, reduction, kw, chunk_size=None, accum_dtype=torch.float32):
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()] + ([b.clone().requires_grad_()] if b is not None else [])
    out = linear_cross_entropy(
        leaves[0], leaves[1], t, leaves[2] if b is not None else None, reduction=reduction,
        class_weight=cw, chunk_size=chunk_size, accum_dtype=accum_dtype, implementation=impl, **kw,
    )
    grad_out = torch.randn(out.shape, dtype=torch.float64)
    grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype))
    return out, grads, grad_out


def _reference(x, w, b, t, cw, reduction, kw, grad_out):
    leaves = [x.detach().double().requires_grad_(), w.detach().double().requires_grad_()]
    if b is not None:
        leaves.append(b.detach().double().requires_grad_())
    cfg = LossConfig(reduction, -100, kw.get("label_smoothing", 0.0), kw.get("z_loss", 0.0), kw.get("softcap"))
    ref, _ = reference_linear_cross_entropy(leaves[0], leaves[1], t, leaves[2] if b is not None else None, cfg, cw)
    return ref, torch.autograd.grad(ref, leaves, grad_out)


# ----------------------------------------------------------------------------- reference
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("feats", list(FEATURES.values()), ids=list(FEATURES))
def test_reference_matches_cross_entropy_definition(reduction, feats):
    seed = _fresh_seed()
    x, w, b, t, cw = _draw(torch.float64, feats)
    kw = _kw(feats)
    logits = F.linear(x, w, b)
    if "softcap" in kw:
        logits = kw["softcap"] * torch.tanh(logits / kw["softcap"])
    expected = F.cross_entropy(logits, t, weight=cw, reduction=reduction, label_smoothing=kw.get("label_smoothing", 0.0))
    valid = t != -100
    z_rows = kw.get("z_loss", 0.0) * torch.logsumexp(logits, 1).square() * valid
    z = {"mean": z_rows.sum() / valid.sum(), "sum": z_rows.sum(), "none": z_rows}[reduction]
    cfg = LossConfig(reduction, -100, kw.get("label_smoothing", 0.0), kw.get("z_loss", 0.0), kw.get("softcap"))
    loss, z_out = reference_linear_cross_entropy(x, w, t, b, cfg, cw)
    assert _rel(loss, expected + z) <= 1e-12, f"seed {seed}"
    assert _rel(z_out, z) <= 1e-12 or float(z.abs().max()) == 0.0, f"seed {seed}"


# ----------------------------------------------------------------------------- chunked
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("feats", list(FEATURES.values()), ids=list(FEATURES))
def test_chunked_matches_float64_reference(dtype, reduction, feats):
    seed = _fresh_seed()
    x, w, b, t, cw = _draw(dtype, feats)
    chunk = int(torch.randint(1, max(2, x.shape[0]), ()))  # rarely divides N
    kw = _kw(feats)
    out, grads, grad_out = _run("chunked", x, w, b, t, cw, reduction, kw, chunk_size=chunk)
    ref, ref_grads = _reference(x, w, b, t, cw, reduction, kw, grad_out)
    msg = f"seed {seed}, shapes x{tuple(x.shape)} w{tuple(w.shape)}, chunk {chunk}"
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert out.shape == ref.shape
    assert _rel(out, ref) <= TOL[dtype], msg
    for name, g, r, leaf in zip(("dX", "dW", "dbias"), grads, ref_grads, (x, w, b)):
        assert g.dtype == leaf.dtype and g.shape == leaf.shape
        if name == "dbias":
            assert _rel_to(g, r, _bias_grad_terms(x, w, b, t, cw, reduction, kw, grad_out)) <= TOL[dtype], msg
        else:
            assert _rel(g, r) <= TOL[dtype], f"{name}: {msg}"


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_every_token_ignored_behaves_like_cross_entropy(reduction):
    seed = _fresh_seed()
    feats = {"label_smoothing": 0.1, "class_weight": True, "bias": True}
    x, w, b, t, cw = _draw(torch.float32, feats, n=37, v=53)
    t.fill_(-100)
    out, grads, _ = _run("chunked", x, w, b, t, cw, reduction, _kw(feats), chunk_size=8)
    expected = F.cross_entropy(F.linear(x, w, b), t, weight=cw.float(), reduction=reduction, label_smoothing=0.1)
    if reduction == "mean":
        assert torch.isnan(out) and torch.isnan(expected), f"seed {seed}"
    else:
        assert torch.equal(out, torch.zeros_like(out)), f"seed {seed}"
    for g in grads:
        assert bool((g == 0).all()), f"seed {seed}"


def test_bf16_dw_accumulation_in_input_dtype_stays_within_bf16_tolerance():
    seed = _fresh_seed()
    x, w, b, t, cw = _draw(torch.bfloat16, {}, n=256, h=16, v=64)
    out, grads, grad_out = _run("chunked", x, w, b, t, cw, "sum", {}, chunk_size=32, accum_dtype=torch.bfloat16)
    ref, ref_grads = _reference(x, w, b, t, cw, "sum", {}, grad_out)
    assert _rel(grads[1], ref_grads[1]) <= 1e-2, f"seed {seed}"


def test_one_chunk_replaces_the_float32_accumulator_when_all_logits_fit_in_its_size():
    from kernels.lce.chunked import CUDA_WIDE_ACCUM_CHUNK_BYTES, default_chunk_size

    cuda = torch.device("cuda")  # only the device type is read: no GPU needed
    h, v = 4096, 128256
    acc_bytes = v * h * 4
    # N=4096 bf16: 1 GiB of logits against a 2 GiB float32 accumulator -> every row in one chunk
    assert default_chunk_size(4096, v, torch.bfloat16, cuda, accumulator_bytes=acc_bytes) == 4096
    assert default_chunk_size(8192, v, torch.bfloat16, cuda, accumulator_bytes=acc_bytes) == 8192
    # N=16384: 4 GiB of logits would exceed it -> chunks within the wide-accumulator budget
    rows = default_chunk_size(16384, v, torch.bfloat16, cuda, accumulator_bytes=acc_bytes)
    assert rows < 16384 and rows * v * 2 <= CUDA_WIDE_ACCUM_CHUNK_BYTES
    # no accumulator asked about, or on the CPU: the budget rule alone
    assert default_chunk_size(4096, v, torch.bfloat16, cuda) < 4096
    assert default_chunk_size(4096, v, torch.bfloat16, torch.device("cpu"), accumulator_bytes=acc_bytes) < 4096


def test_one_chunk_of_half_precision_rows_accumulates_dw_in_float32_without_an_accumulator(monkeypatch):
    import kernels.lce.chunked as chunked

    seed = _fresh_seed()
    x, w, b, t, cw = _draw(torch.bfloat16, {}, n=300, h=16, v=64)
    allocated: list[torch.dtype] = []
    real_empty = torch.empty

    def spy(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        if tuple(out.shape) == tuple(w.shape):
            allocated.append(out.dtype)
        return out

    monkeypatch.setattr(chunked.torch, "empty", spy)
    out, grads, grad_out = _run("chunked", x, w, b, t, cw, "sum", {}, chunk_size=300)
    monkeypatch.setattr(chunked.torch, "empty", real_empty)
    assert allocated == [torch.bfloat16], f"seed {seed}: weight-sized buffers {allocated}"
    ref, ref_grads = _reference(x, w, b, t, cw, "sum", {}, grad_out)
    assert _rel(grads[1], ref_grads[1]) <= 1e-2, f"seed {seed}"
    # several chunks: a float32 accumulator (rounded once at the end) is allocated again
    allocated.clear()
    monkeypatch.setattr(chunked.torch, "empty", spy)
    _run("chunked", x, w, b, t, cw, "sum", {}, chunk_size=64)
    assert allocated == [torch.float32], f"seed {seed}: weight-sized buffers {allocated}"


def test_leading_dimensions_and_none_shape():
    _fresh_seed()
    x = torch.randn(3, 5, 8)
    w = torch.randn(11, 8)
    t = torch.randint(0, 11, (3, 5))
    out = linear_cross_entropy(x, w, t, reduction="none", chunk_size=4)
    assert out.shape == (3, 5)
    expected = F.cross_entropy(F.linear(x, w).reshape(15, 11), t.reshape(15), reduction="none").reshape(3, 5)
    assert _rel(out, expected) <= 1e-5


def test_unbatched_input():
    x, w, t = torch.randn(8, dtype=torch.float64), torch.randn(11, 8, dtype=torch.float64), torch.tensor(4)
    out = linear_cross_entropy(x, w, t)
    assert out.shape == ()
    assert _rel(out, F.cross_entropy(F.linear(x, w), t)) <= 1e-10


@pytest.mark.parametrize("impl", ["chunked", "reference"])
def test_zero_features_give_cross_entropy_of_the_bias(impl):
    """H = 0 failed in reshape(-1, 0) (which cannot infer the rows) with an untyped RuntimeError."""
    x = torch.randn(2, 3, 0, requires_grad=True)
    w = torch.randn(5, 0, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    t = torch.randint(0, 5, (2, 3))
    loss = linear_cross_entropy(x, w, t, b, implementation=impl)
    loss.backward()
    br = b.detach().clone().requires_grad_()
    expected = F.cross_entropy(br.expand(6, 5), t.reshape(-1))
    expected.backward()
    assert _rel(loss, expected) <= 1e-6 and _rel(b.grad, br.grad) <= 1e-6
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


def test_no_grad_returns_loss_only():
    x = torch.randn(20, 8, requires_grad=True)
    w = torch.randn(30, 8, requires_grad=True)
    t = torch.randint(0, 30, (20,))
    with torch.no_grad():
        out = linear_cross_entropy(x, w, t, chunk_size=7, label_smoothing=0.1)
    assert out.grad_fn is None and not out.requires_grad
    assert _rel(out, F.cross_entropy(F.linear(x, w), t, label_smoothing=0.1)) <= 1e-5


@pytest.mark.parametrize("which", ["input", "weight", "bias", "input+bias"])
def test_only_some_inputs_require_grad(which):
    _fresh_seed()
    x, w, b, t, cw = _draw(torch.float64, {"bias": True}, n=40, h=8, v=25, ignore_frac=0.0)
    x.requires_grad_("input" in which)
    w.requires_grad_(which == "weight")
    b.requires_grad_("bias" in which)
    out = linear_cross_entropy(x, w, t, b, chunk_size=9, z_loss=1e-3)
    out.backward()
    xr, wr, br = (p.detach().clone().requires_grad_(p.requires_grad) for p in (x, w, b))
    ref = F.cross_entropy(F.linear(xr, wr, br), t) + 1e-3 * torch.logsumexp(F.linear(xr, wr, br), 1).square().mean()
    ref.backward()
    for p, r in ((x, xr), (w, wr), (b, br)):
        if p.requires_grad:
            assert _rel(p.grad, r.grad) <= 1e-10
        else:
            assert p.grad is None


def test_return_z_loss_is_detached_and_included():
    x, w = torch.randn(30, 8, dtype=torch.float64), torch.randn(40, 8, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 40, (30,))
    t[:5] = -100
    loss, z = linear_cross_entropy(x, w, t, z_loss=0.01, return_z_loss=True, chunk_size=7)
    logits = F.linear(x, w)
    expected_z = 0.01 * torch.logsumexp(logits[5:], 1).square().mean()
    assert not z.requires_grad
    assert _rel(z, expected_z) <= 1e-12
    assert _rel(loss, F.cross_entropy(logits, t) + expected_z) <= 1e-12


def test_gradient_scaled_by_upstream_and_backward_twice_raises():
    x = torch.randn(16, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(12, 8, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 12, (16,))
    loss = linear_cross_entropy(x, w, t)
    (3.5 * loss).backward(retain_graph=True)
    xr, wr = x.detach().requires_grad_(), w.detach().clone().requires_grad_()
    (3.5 * F.cross_entropy(F.linear(xr, wr), t)).backward()
    assert _rel(w.grad, wr.grad) <= 1e-12
    with pytest.raises(BackwardTwiceError):
        loss.backward()


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_double_backward_is_refused_and_reference_has_one(reduction):
    """create_graph=True gave "mean" a gradient autograd took for a constant (a gradient penalty
    on it added nothing, silently) and "none" an untyped error from mm(out=)."""
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 8, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 7, (5,))
    loss = linear_cross_entropy(x, w, t, reduction=reduction).sum()
    with pytest.raises(UnsupportedFeatureError, match="create_graph=True"):
        torch.autograd.grad(loss, x, create_graph=True)
    ref = linear_cross_entropy(x, w, t, reduction=reduction, implementation="reference").sum()
    (gx,) = torch.autograd.grad(ref, x, create_graph=True)
    (gw,) = torch.autograd.grad(gx.square().sum(), w)
    assert gw.abs().sum() > 0


def test_never_materialises_more_than_one_chunk_of_logits():
    n, h, v, chunk = 256, 16, 512, 32

    class LargestTensor(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(o, torch.Tensor):
                    LargestTensor.largest = max(LargestTensor.largest, o.numel())
            return out

    x = torch.randn(n, h, requires_grad=True)
    w = torch.randn(v, h, requires_grad=True)
    t = torch.randint(0, v, (n,))
    with LargestTensor():
        loss = linear_cross_entropy(x, w, t, chunk_size=chunk, label_smoothing=0.1, softcap=5.0, z_loss=1e-3)
        loss.backward()
    assert LargestTensor.largest <= max(chunk * v, v * h, n * h)
    assert LargestTensor.largest < n * v


def test_autocast_runs_the_projection_in_the_autocast_dtype():
    x = torch.randn(24, 16, requires_grad=True)
    w = torch.randn(40, 16, requires_grad=True)
    t = torch.randint(0, 40, (24,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(x, w, t, chunk_size=5)
        expected = F.cross_entropy(F.linear(x, w).float(), t)
    loss.backward()
    assert loss.dtype == torch.float32
    assert w.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    assert _rel(loss, expected) <= 1e-2
    wr = w.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        F.cross_entropy(F.linear(x.detach(), wr).float(), t).backward()
    assert _rel(w.grad, wr.grad) <= 1e-2


def test_autocast_keeps_a_float32_weights_gradient_in_float32_end_to_end():
    """Under bf16 autocast the products run in bf16, but an fp32 weight's gradient is
    accumulated in fp32 straight into its fp32 .grad: never rounded to bf16 on the way (it used
    to come back as bf16 upcast to fp32, as F.linear's does)."""
    _fresh_seed()
    n, h, v = 256, 32, 96
    x = torch.randn(n, h, requires_grad=True)
    w = (torch.randn(v, h) * h**-0.5).requires_grad_()
    t = torch.randint(0, v, (n,))
    t[::9] = -100
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(x, w, t, chunk_size=40, label_smoothing=0.1)
    loss.backward()
    assert w.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    representable = (w.grad == w.grad.bfloat16().float()).float().mean()
    assert representable < 0.5, f"{representable:.0%} of dW is bf16-representable: it went through bf16"
    # against float64 on the bf16-rounded operands (what the products see)
    xb, wb = (p.detach().bfloat16().double().requires_grad_() for p in (x, w))
    ref = F.cross_entropy(F.linear(xb, wb), t, label_smoothing=0.1)
    ref.backward()
    assert _rel(loss, ref) <= 1e-2
    assert _rel(w.grad, wb.grad) <= 1e-2 and _rel(x.grad, xb.grad) <= 1e-2


# ----------------------------------------------------------------------------- module
def test_module_is_a_drop_in_for_torch_module():
    torch_cls = getattr(torch.nn, "LinearCrossEntropyLoss", None)
    if torch_cls is None:
        pytest.skip("this torch has no nn.LinearCrossEntropyLoss")
    _fresh_seed()
    cw = torch.rand(50, dtype=torch.float64) + 0.5
    kwargs = dict(bias=True, reduction="sum", weight=cw, ignore_index=3, label_smoothing=0.2, dtype=torch.float64)
    theirs = torch_cls(16, 50, **kwargs)
    mine = LinearCrossEntropyLoss(16, 50, **kwargs, chunk_size=7)
    mine.load_state_dict(theirs.state_dict())
    x = torch.randn(33, 16, dtype=torch.float64)
    t = torch.randint(0, 50, (33,))
    t[::4] = 3
    a, b = theirs(x, t), mine(x, t)
    a.backward()
    b.backward()
    assert _rel(b, a) <= 1e-12
    assert _rel(mine.linear.weight.grad, theirs.linear.weight.grad) <= 1e-10
    assert _rel(mine.linear.bias.grad, theirs.linear.bias.grad) <= 1e-10


def test_module_k_dimensional_routes_to_reference_and_says_so():
    torch_cls = getattr(torch.nn, "LinearCrossEntropyLoss", None)
    if torch_cls is None:
        pytest.skip("this torch has no nn.LinearCrossEntropyLoss")
    theirs = torch_cls(5, 10, out_features=(4, 3), dtype=torch.float64)
    mine = LinearCrossEntropyLoss(5, 10, out_features=(4, 3), dtype=torch.float64)
    mine.load_state_dict(theirs.state_dict())
    x, t = torch.randn(2, 5, dtype=torch.float64), torch.randint(0, 10, (2, 4, 3))
    with pytest.warns(UserWarning, match="reference"):
        out = mine(x, t)
    assert _rel(out, theirs(x, t)) <= 1e-12
    with pytest.raises(UnsupportedFeatureError):
        LinearCrossEntropyLoss(5, 10, out_features=(4, 3), implementation="chunked")(x.float(), t)


def test_weight_tying_accumulates_into_the_embedding():
    _fresh_seed()
    emb = torch.nn.Embedding(40, 8, dtype=torch.float64)
    head = LinearCrossEntropyLoss(8, 40, dtype=torch.float64, chunk_size=5, z_loss=1e-3)
    head.linear.weight = emb.weight
    tokens = torch.randint(0, 40, (2, 9))
    hidden = emb(tokens[:, :-1])
    loss = head(hidden, tokens[:, 1:])
    loss.backward()
    ref_w = emb.weight.detach().clone().requires_grad_()
    h = F.embedding(tokens[:, :-1], ref_w)
    logits = F.linear(h, ref_w).reshape(-1, 40)
    ref = F.cross_entropy(logits, tokens[:, 1:].reshape(-1)) + 1e-3 * torch.logsumexp(logits, 1).square().mean()
    ref.backward()
    assert _rel(emb.weight.grad, ref_w.grad) <= 1e-10


# ----------------------------------------------------------------------------- class probabilities
def _probabilities(n, v, dtype, kind):
    """Soft targets: a softmax, unnormalised non-negative values (F.cross_entropy does not
    require rows to sum to 1), or one-hot rows with some all-zero rows."""
    if kind == "softmax":
        return torch.softmax(torch.randn(n, v, dtype=torch.float64) * 2, 1).to(dtype)
    if kind == "unnormalised":
        return (torch.rand(n, v, dtype=torch.float64) * 3).to(dtype)
    y = F.one_hot(torch.randint(0, v, (n,)), v).to(dtype)
    y[torch.rand(n) < 0.2] = 0
    return y


@pytest.mark.parametrize("impl", ["chunked", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("feats", list(FEATURES.values()), ids=list(FEATURES))
def test_probability_targets_match_cross_entropy(impl, dtype, reduction, feats):
    seed = _fresh_seed()
    x, w, b, _, cw = _draw(dtype, feats)
    n, v = x.shape[0], w.shape[0]
    kind = random.Random(seed).choice(["softmax", "unnormalised", "one-hot"])
    y = _probabilities(n, v, dtype, kind)
    y_before = y.clone()
    kw = _kw(feats)
    chunk = int(torch.randint(1, max(2, n), ()))
    out, grads, grad_out = _run(impl, x, w, b, y, cw, reduction, kw, chunk_size=chunk)
    msg = f"seed {seed}, {kind}, x{tuple(x.shape)} w{tuple(w.shape)}, chunk {chunk}"
    assert torch.equal(y, y_before), "the target was modified: " + msg
    leaves = [t.detach().double().requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
    logits = F.linear(leaves[0], leaves[1], leaves[2] if b is not None else None)
    # the logits rounded to the input dtype, as the chunked implementation (and F.linear) produces
    # them; with soft targets their bf16 rounding alone moves the float64 loss's gradients by
    # ~1e-2. The reference implementation computes its logits in float32, so its truth is the
    # unrounded one (held to the rounded one, seed 1853489832 failed with dW off by 1.15e-2,
    # against 1.7e-3 from the unrounded truth)
    if impl != "reference":
        logits = logits + (logits.detach().to(dtype).double() - logits.detach())
    if "softcap" in kw:
        logits = kw["softcap"] * torch.tanh(logits / kw["softcap"])
    ref = F.cross_entropy(logits, y.double(), weight=cw, reduction=reduction,
                          label_smoothing=kw.get("label_smoothing", 0.0))
    z_rows = kw.get("z_loss", 0.0) * torch.logsumexp(logits, 1).square()
    ref = ref + {"mean": z_rows.mean(), "sum": z_rows.sum(), "none": z_rows}[reduction]
    ref_grads = torch.autograd.grad(ref, leaves, grad_out)
    assert out.shape == ref.shape == (n,) if reduction == "none" else out.shape == ()
    assert _rel(out, ref) <= TOL[dtype], msg
    for name, g, r in zip(("dX", "dW", "dbias"), grads, ref_grads):
        if name == "dbias":  # a sum that cancels: measured against its terms (seed 1246660863 was off by 1.6e-2)
            assert _rel_to(g, r, _bias_grad_terms(x, w, b, y, cw, reduction, kw, grad_out)) <= TOL[dtype], msg
        else:
            assert _rel(g, r) <= TOL[dtype], f"{name}: {msg}"


def test_probability_targets_keep_leading_dimensions_and_work_without_grad():
    _fresh_seed()
    x, w = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(13, 8, dtype=torch.float64)
    y = torch.softmax(torch.randn(2, 5, 13, dtype=torch.float64), -1)
    per_row = linear_cross_entropy(x, w, y, reduction="none", chunk_size=3)
    assert per_row.shape == (2, 5)
    expected = F.cross_entropy(F.linear(x, w).reshape(-1, 13), y.reshape(-1, 13), reduction="none").reshape(2, 5)
    assert _rel(per_row, expected) <= 1e-12
    with torch.no_grad():
        assert _rel(linear_cross_entropy(x, w, y, chunk_size=4), expected.mean()) <= 1e-12


def test_module_takes_probability_targets_as_the_torch_module_does():
    torch_cls = getattr(torch.nn, "LinearCrossEntropyLoss", None)
    if torch_cls is None:
        pytest.skip("this torch has no nn.LinearCrossEntropyLoss")
    _fresh_seed()
    kwargs = dict(bias=True, reduction="mean", weight=torch.rand(30, dtype=torch.float64) + 0.5,
                  label_smoothing=0.1, dtype=torch.float64)
    theirs = torch_cls(12, 30, **kwargs)
    mine = LinearCrossEntropyLoss(12, 30, **kwargs, chunk_size=8)
    mine.load_state_dict(theirs.state_dict())
    x = torch.randn(21, 12, dtype=torch.float64)
    y = torch.softmax(torch.randn(21, 30, dtype=torch.float64), 1)
    a, b = theirs(x, y), mine(x, y)
    a.backward()
    b.backward()
    assert _rel(b, a) <= 1e-12
    assert _rel(mine.linear.weight.grad, theirs.linear.weight.grad) <= 1e-10


def test_module_k_dimensional_probability_targets_route_to_reference_as_the_torch_module():
    torch_cls = getattr(torch.nn, "LinearCrossEntropyLoss", None)
    if torch_cls is None:
        pytest.skip("this torch has no nn.LinearCrossEntropyLoss")
    _fresh_seed()
    for reduction in ("mean", "sum", "none"):
        theirs = torch_cls(5, 10, out_features=(4, 3), reduction=reduction, dtype=torch.float64)
        mine = LinearCrossEntropyLoss(5, 10, out_features=(4, 3), reduction=reduction, dtype=torch.float64)
        mine.load_state_dict(theirs.state_dict())
        x = torch.randn(2, 5, dtype=torch.float64)
        y = torch.softmax(torch.randn(2, 10, 4, 3, dtype=torch.float64), 1)
        with pytest.warns(UserWarning, match="reference"):
            out = mine(x, y)
        expected = theirs(x, y)
        assert out.shape == expected.shape and _rel(out, expected) <= 1e-12


def test_probability_targets_route_past_the_triton_kernel():
    x, w = torch.randn(4, 8), torch.randn(16, 8)
    assert select_implementation("auto", x, w, probabilities=True).implementation == "chunked"
    with pytest.raises(UnsupportedFeatureError, match="class probabilities"):
        select_implementation("triton", x, w, probabilities=True)


# ----------------------------------------------------------------------------- routing, errors
def test_auto_routes_cpu_to_chunked_and_route_is_observable():
    x, w = torch.randn(4, 8), torch.randn(16, 8)
    route = select_implementation("auto", x, w)
    assert route.implementation == "chunked" and route.reason
    assert select_implementation("reference", x, w).implementation == "reference"


@pytest.mark.skipif(triton_usable(torch.device("cpu")), reason="triton interpreter active")
def test_triton_on_cpu_is_refused():
    with pytest.raises(UnsupportedFeatureError):
        linear_cross_entropy(torch.randn(4, 8), torch.randn(16, 8), torch.randint(0, 16, (4,)), implementation="triton")


def _good():
    return torch.randn(6, 8), torch.randn(10, 8), torch.randint(0, 10, (6,))


BAD_CALLS = {
    "weight dtype": (lambda x, w, t: linear_cross_entropy(x, w.double(), t), LCETypeError, "weight dtype"),
    "integer input": (lambda x, w, t: linear_cross_entropy(x.long(), w.long(), t), LCETypeError, "floating-point"),
    "float target of index shape": (lambda x, w, t: linear_cross_entropy(x, w, t.float()), LCEValueError,
                                    "class probabilities of shape"),
    "complex target": (lambda x, w, t: linear_cross_entropy(x, w, t.to(torch.complex64)), LCETypeError,
                       "class indices or"),
    "ignore_index with probabilities": (
        lambda x, w, t: linear_cross_entropy(x, w, torch.rand(6, 10), ignore_index=3), LCEValueError,
        "class-index targets only"),
    "probabilities with a K-dim weight on chunked": (
        lambda x, w, t: linear_cross_entropy(x, w.reshape(10, 1, 8), torch.rand(6, 10, 1), implementation="chunked"),
        UnsupportedFeatureError, "K-dimensional"),
    "probabilities on triton": (
        lambda x, w, t: linear_cross_entropy(x, w, torch.rand(6, 10), implementation="triton"),
        UnsupportedFeatureError, "class probabilities need"),
    "target shape": (lambda x, w, t: linear_cross_entropy(x, w, t[:-1]), LCEValueError, "target shape"),
    "hidden size": (lambda x, w, t: linear_cross_entropy(x, w[:, :-1], t), LCEValueError, "feature size"),
    "1-D weight": (lambda x, w, t: linear_cross_entropy(x, w[0], t), LCEValueError, "num_classes"),
    "bias shape": (lambda x, w, t: linear_cross_entropy(x, w, t, torch.randn(9)), LCEValueError, "bias"),
    "bias dtype": (lambda x, w, t: linear_cross_entropy(x, w, t, torch.randn(10).double()), LCETypeError, "bias dtype"),
    "class_weight shape": (lambda x, w, t: linear_cross_entropy(x, w, t, class_weight=torch.ones(9)), LCEValueError, "class_weight"),
    "class_weight dtype": (lambda x, w, t: linear_cross_entropy(x, w, t, class_weight=torch.ones(10, dtype=torch.long)), LCETypeError, "class_weight"),
    "reduction": (lambda x, w, t: linear_cross_entropy(x, w, t, reduction="avg"), LCEValueError, "reduction"),
    "label_smoothing": (lambda x, w, t: linear_cross_entropy(x, w, t, label_smoothing=1.5), LCEValueError, "label_smoothing"),
    "z_loss": (lambda x, w, t: linear_cross_entropy(x, w, t, z_loss=-1.0), LCEValueError, "z_loss"),
    "softcap": (lambda x, w, t: linear_cross_entropy(x, w, t, softcap=0.0), LCEValueError, "softcap"),
    "label_smoothing string": (lambda x, w, t: linear_cross_entropy(x, w, t, label_smoothing="0.1"), LCETypeError,
                               "label_smoothing must be a real number, got str"),
    "z_loss string": (lambda x, w, t: linear_cross_entropy(x, w, t, z_loss="1e-4"), LCETypeError, "z_loss"),
    "softcap string": (lambda x, w, t: linear_cross_entropy(x, w, t, softcap="30"), LCETypeError, "softcap"),
    "label_smoothing bool": (lambda x, w, t: linear_cross_entropy(x, w, t, label_smoothing=True), LCETypeError,
                             "label_smoothing"),
    "chunk_size": (lambda x, w, t: linear_cross_entropy(x, w, t, chunk_size=0), LCEValueError, "chunk_size"),
    "accum_dtype": (lambda x, w, t: linear_cross_entropy(x, w, t, accum_dtype=torch.float16), LCEValueError, "accum_dtype"),
    "implementation": (lambda x, w, t: linear_cross_entropy(x, w, t, implementation="cuda"), LCEValueError, "implementation"),
    "ignore_index type": (lambda x, w, t: linear_cross_entropy(x, w, t, ignore_index=1.5), LCETypeError, "ignore_index"),
    "target out of range": (lambda x, w, t: linear_cross_entropy(x, w, torch.full_like(t, 10)), LCEValueError, "out of range"),
    "device": (lambda x, w, t: linear_cross_entropy(x, w.to("meta"), t), LCEDeviceError, "meta"),
    "K-dim weight on chunked": (
        lambda x, w, t: linear_cross_entropy(x, w.reshape(10, 1, 8), t.reshape(6, 1), implementation="chunked"),
        UnsupportedFeatureError, "K-dimensional",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS), ids=list(BAD_CALLS))
def test_bad_input_raises_typed_error(case):
    call, error, words = BAD_CALLS[case]
    with pytest.raises(error, match=words):
        call(*_good())


def test_module_constructor_validates():
    with pytest.raises(LCEValueError, match="weight shape"):
        LinearCrossEntropyLoss(4, 10, weight=torch.ones(3))
    with pytest.raises(LCEValueError, match="label_smoothing"):
        LinearCrossEntropyLoss(4, 10, label_smoothing=2.0)
    with pytest.raises(LCEValueError, match="in_features"):
        LinearCrossEntropyLoss(0, 10)
    with pytest.raises(LCEValueError, match="implementation"):
        LinearCrossEntropyLoss(4, 10, implementation="fast")
    with pytest.raises(LCETypeError, match="z_loss must be a real number"):
        LinearCrossEntropyLoss(4, 10, z_loss="1e-4")
    with pytest.raises(LCETypeError, match="class weights"):  # was an AttributeError on list.shape
        LinearCrossEntropyLoss(4, 10, weight=[1.0] * 10)
    with pytest.raises(LCEValueError, match="chunk_size"):  # these two were taken, to fail at the first call
        LinearCrossEntropyLoss(4, 10, chunk_size=0)
    with pytest.raises(LCETypeError, match="accum_dtype"):
        LinearCrossEntropyLoss(4, 10, accum_dtype="float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "z_loss=0.5" in repr(LinearCrossEntropyLoss(4, 10, z_loss=0.5))


# --------------------------------------------------------------------------- torch.compile
COMPILE_CASES = {
    "mean": ("mean", {}, True, True),
    "sum, input without grad": ("sum", {}, True, False),
    "none": ("none", {}, True, True),
    "mean, every feature, no bias": ("mean", {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 20.0}, False, True),
}


@pytest.mark.parametrize("case", list(COMPILE_CASES), ids=list(COMPILE_CASES))
def test_compiles_in_one_graph_with_the_eager_numbers(case):
    # fullgraph: the chunked driver is one operator in the graph (before, its CPU target check's
    # .item() and the Function's chunk loop broke the graph)
    reduction, kw, with_bias, input_grad = COMPILE_CASES[case]
    x = torch.randn(300, 64, requires_grad=input_grad)
    w = torch.randn(1000, 64, requires_grad=True)
    b = torch.randn(1000, requires_grad=True) if with_bias else None
    t = torch.randint(0, 1000, (300,))
    t[::7] = -100

    def f(x, w, b, t):
        out = linear_cross_entropy(torch.tanh(x), w, t, b, reduction=reduction, chunk_size=128,
                                   implementation="chunked", return_z_loss=True, **kw)
        return (out[0].square().sum() if reduction == "none" else out[0]), out[1]

    leaves = [p for p in (x, w, b) if p is not None and p.requires_grad]
    eager = f(x, w, b, t)
    torch._dynamo.reset()
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(x, w, b, t)
    assert not got[1].requires_grad  # the z-loss term is returned detached, as in eager mode
    for a, e in zip((*got, *torch.autograd.grad(got[0] * 3, leaves)), (*eager, *torch.autograd.grad(eager[0] * 3, leaves))):
        assert torch.equal(a, e)


def test_compiled_call_checks_targets_and_runs_without_grad():
    x, w = torch.randn(50, 64), torch.randn(100, 64)
    f = torch.compile(lambda x, w, t: linear_cross_entropy(x, w, t, z_loss=1e-2), backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        t = torch.randint(0, 100, (50,))
        assert torch.equal(f(x, w, t), linear_cross_entropy(x, w, t, z_loss=1e-2))
        with pytest.raises(LCEValueError, match="target value 100 is out of range"):
            f(x, w, torch.full((50,), 100))


def test_column_blocks_cover_every_column_once_in_tile_multiples():
    from kernels.lce.chunked import MIN_BLOCK_COLUMNS, column_blocks

    for cols in (1, 127, 1024, 2047, 2048, 2176, 4096, 5000, 16384):
        for blocks in (1, 2, 3, 4, 8):
            spans = column_blocks(cols, blocks)
            assert spans[0].start == 0 and spans[-1].stop == cols
            assert all(a.stop == b.start for a, b in zip(spans, spans[1:]))
            assert len(spans) <= blocks
            if len(spans) > 1:
                assert all((s.stop - s.start) % 128 == 0 for s in spans[:-1])
                assert all(s.stop - s.start >= MIN_BLOCK_COLUMNS for s in spans[:-1])


@pytest.mark.parametrize("acc_dtype,dtype", [(torch.float64, torch.float64), (torch.float32, torch.bfloat16)])
def test_an_accumulating_product_in_column_blocks_equals_the_whole_product(acc_dtype, dtype):
    from kernels.lce.chunked import _accumulate

    a = torch.randn(300, 64).to(dtype)
    b = torch.randn(64, 2176).to(dtype)
    acc = torch.randn(300, 2176, dtype=acc_dtype)
    whole = acc.clone()
    _accumulate(whole, a, b, first=False, blocks=1)
    _accumulate(acc, a, b, first=False, blocks=2)
    assert torch.allclose(acc, whole, rtol=1e-6, atol=1e-6)
    start = torch.randn(300, 2176, dtype=acc_dtype)
    acc = start.clone()
    _accumulate(acc, a, b, first=False, blocks=2)
    assert torch.allclose(acc, start + a.to(acc_dtype) @ b.to(acc_dtype), rtol=1e-5, atol=1e-4)
