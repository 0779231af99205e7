"""CUDA checks of the fused linear + cross-entropy loss (Triton and chunked routes).

Each case draws fresh random inputs and compares loss, dX, dW and dbias against the float64
reference on the same (rounded) inputs: fp32 within 1e-5 relative, bf16/fp16 within 1e-2.
"""
from __future__ import annotations

import pytest
import torch

from kernels.lce import linear_cross_entropy, reference_linear_cross_entropy, select_implementation
from kernels.lce.config import LossConfig
from tests.helpers.cuda import returns_while_the_gpu_is_busy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
FEATURES = [
    {},
    {"label_smoothing": 0.1},
    {"z_loss": 1e-3},
    {"softcap": 5.0},
    {"class_weight": True},
    {"label_smoothing": 0.2, "z_loss": 1e-3, "softcap": 4.0, "class_weight": True, "bias": True},
]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    if torch.isnan(b).any():
        return 0.0 if torch.equal(torch.isnan(a), torch.isnan(b)) else float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _case(dtype, reduction, feats, implementation, n=333, h=96, v=1003, chunk=128, all_ignored=False, **extra):
    dev = "cuda"
    x = (torch.randn(n, h, device=dev) * 0.5).to(dtype)
    w = (torch.randn(v, h, device=dev) * h**-0.5).to(dtype)
    b = (torch.randn(v, device=dev) * 0.1).to(dtype) if feats.get("bias") else None
    t = torch.randint(0, v, (n,), device=dev)
    t[torch.rand(n, device=dev) < 0.1] = -100
    if all_ignored:
        t.fill_(-100)
    cw = torch.rand(v, device=dev) + 0.5 if feats.get("class_weight") else None
    kw = {k: feats[k] for k in ("label_smoothing", "z_loss", "softcap") if k in feats}
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()] + ([b.clone().requires_grad_()] if b is not None else [])
    out = linear_cross_entropy(
        leaves[0], leaves[1], t, leaves[2] if b is not None else None, reduction=reduction,
        class_weight=cw, chunk_size=chunk, implementation=implementation, **kw, **extra,
    )
    grad_out = torch.randn(out.shape, device=dev, dtype=torch.float64)
    grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype))
    ref_leaves = [p.detach().double().requires_grad_() for p in leaves]
    cfg = LossConfig(reduction, -100, kw.get("label_smoothing", 0.0), kw.get("z_loss", 0.0), kw.get("softcap"))
    ref, _ = reference_linear_cross_entropy(
        ref_leaves[0], ref_leaves[1], t, ref_leaves[2] if b is not None else None, cfg,
        cw.double() if cw is not None else None,
    )
    ref_grads = torch.autograd.grad(ref, ref_leaves, grad_out, allow_unused=True)
    return out, grads, ref, ref_grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("feats", FEATURES, ids=lambda f: "+".join(f) or "plain")
def test_triton_matches_float64_reference(dtype, reduction, feats):
    out, grads, ref, ref_grads = _case(dtype, reduction, feats, "triton")
    tol = TOL[dtype]
    assert _rel(out, ref) <= tol
    for name, g, r in zip(("dX", "dW", "dbias"), grads, ref_grads):
        assert _rel(g, r) <= tol, name


@pytest.mark.parametrize("accum", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("feats", [{}, FEATURES[-1]], ids=["plain", "every-feature"])
def test_row_chunks_accumulate_dw_in_column_blocks_like_the_reference(accum, feats):
    from kernels.lce.chunked import ACCUMULATE_COLUMN_BLOCKS, column_blocks

    h = 2176  # wide enough to split: blocks of 1152 and 1024 columns
    assert len(column_blocks(h, ACCUMULATE_COLUMN_BLOCKS)) == 2
    out, grads, ref, ref_grads = _case(torch.bfloat16, "sum", feats, "triton", n=700, h=h, chunk=128,
                                       accum_dtype=accum)
    assert _rel(out, ref) <= 1e-2
    for name, g, r in zip(("dX", "dW", "dbias"), grads, ref_grads):
        assert _rel(g, r) <= 1e-2, name


def _holds_logits_tail(grad_weight: torch.Tensor) -> bool:
    """Whether a weight gradient is the front of a class-major buffer (its storage is larger)."""
    return grad_weight.untyped_storage().nbytes() > grad_weight.numel() * grad_weight.element_size()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("feats", FEATURES, ids=lambda f: "+".join(f) or "plain")
def test_class_major_layout_matches_float64_reference(dtype, reduction, feats):
    out, grads, ref, ref_grads = _case(dtype, reduction, feats, "triton", chunk=None)
    assert _holds_logits_tail(grads[1]), "the default took row chunks"
    tol = TOL[dtype]
    assert _rel(out, ref) <= tol
    for name, g, r in zip(("dX", "dW", "dbias"), grads, ref_grads):
        assert _rel(g, r) <= tol, name


def test_class_major_layout_holds_only_its_tail_beyond_the_gradients():
    from kernels.lce.class_major import class_major_slab_rows, slab_layout

    n, h, v = 2048, 2048, 32000
    x = (torch.randn(n, h, device="cuda") * 0.5).bfloat16().requires_grad_()
    w = (torch.randn(v, h, device="cuda") * h**-0.5).bfloat16().requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")
    peaks = {}
    for chunk in (None, 1024):
        for _ in range(2):  # the second pass: kernels compiled, cuBLAS workspace in place
            x.grad = w.grad = None
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            linear_cross_entropy(x, w, t, chunk_size=chunk).backward()
            torch.cuda.synchronize()
            grads = x.grad.numel() * 2 + w.grad.numel() * 2
            peaks[chunk] = torch.cuda.max_memory_allocated() - base - grads
    layout = slab_layout(n, h, v, 2, 2, class_major_slab_rows(n, h, v, 2, 2))
    assert _holds_logits_tail(w.grad) is False  # the last call took 1024-row chunks
    assert peaks[None] <= layout.extra_bytes + 4 * 2**20, (peaks, layout)
    assert peaks[1024] >= 1024 * v * 2  # one chunk of logits
    assert peaks[None] < peaks[1024]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_on_cuda_matches_reference(dtype):
    feats = {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 4.0, "class_weight": True, "bias": True}
    out, grads, ref, ref_grads = _case(dtype, "mean", feats, "chunked")
    assert _rel(out, ref) <= TOL[dtype]
    for g, r in zip(grads, ref_grads):
        assert _rel(g, r) <= TOL[dtype]


def test_every_token_ignored_on_cuda():
    out, grads, ref, _ = _case(torch.bfloat16, "mean", {"label_smoothing": 0.1}, "triton", all_ignored=True)
    assert torch.isnan(out) and torch.isnan(ref)
    assert all(bool((g == 0).all()) for g in grads)


def test_bf16_weight_grad_accumulated_in_fp32_is_closer_than_bf16_accumulation():
    torch.manual_seed(torch.seed() % 2**31)
    n, h, v = 4096, 64, 512
    x = torch.randn(n, h, device="cuda").bfloat16()
    w = (torch.randn(v, h, device="cuda") * 0.1).bfloat16()
    t = torch.randint(0, v, (n,), device="cuda")
    errs = {}
    wr = w.double().requires_grad_()
    linear_ref = reference_linear_cross_entropy(x.double(), wr, t, None, LossConfig("sum"))[0]
    (gref,) = torch.autograd.grad(linear_ref, wr)
    for acc in (torch.float32, torch.bfloat16):
        wl = w.clone().requires_grad_()
        loss = linear_cross_entropy(x, wl, t, reduction="sum", chunk_size=64, accum_dtype=acc, implementation="triton")
        (g,) = torch.autograd.grad(loss, wl)
        errs[acc] = _rel(g, gref)
    assert errs[torch.float32] < errs[torch.bfloat16]
    assert errs[torch.float32] <= 1e-2


def test_auto_routes_to_triton_on_cuda():
    x = torch.randn(4, 8, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(16, 8, device="cuda", dtype=torch.bfloat16)
    assert select_implementation("auto", x, w).implementation == "triton"
    assert select_implementation("auto", x.double(), w.double()).implementation == "chunked"


@pytest.mark.parametrize("chunk", [128, None], ids=["row-chunks", "class-major"])
def test_autocast_accumulates_a_float32_weights_gradient_in_float32_on_cuda(chunk):
    torch.manual_seed(torch.seed() % 2**31)
    n, h, v = 1024, 64, 1000
    x = torch.randn(n, h, device="cuda", requires_grad=True)
    w = (torch.randn(v, h, device="cuda") * h**-0.5).requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = linear_cross_entropy(x, w, t, chunk_size=chunk, z_loss=1e-4)
    loss.backward()
    assert w.grad.dtype == torch.float32
    assert _holds_logits_tail(w.grad) == (chunk is None)
    assert float((w.grad == w.grad.bfloat16().float()).float().mean()) < 0.5  # not rounded through bf16
    xb, wb = (p.detach().bfloat16().double().requires_grad_() for p in (x, w))
    ref, _ = reference_linear_cross_entropy(xb, wb, t, None, LossConfig("mean", -100, 0.0, 1e-4, None))
    ref.backward()
    assert _rel(loss, ref) <= 1e-2 and _rel(w.grad, wb.grad) <= 1e-2 and _rel(x.grad, xb.grad) <= 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_probability_targets_on_cuda_take_the_chunked_route_and_say_so(dtype):
    torch.manual_seed(torch.seed() % 2**31)
    n, h, v = 300, 32, 1000
    x = torch.randn(n, h, device="cuda").to(dtype).requires_grad_()
    w = (torch.randn(v, h, device="cuda") * 0.2).to(dtype).requires_grad_()
    y = torch.softmax(torch.randn(n, v, device="cuda"), 1).to(dtype)
    with pytest.warns(UserWarning, match="chunked"):
        loss = linear_cross_entropy(x, w, y, label_smoothing=0.1, z_loss=1e-3, chunk_size=128)
    gx, gw = torch.autograd.grad(loss, (x, w))
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = reference_linear_cross_entropy(xr, wr, y.double(), None, LossConfig("mean", -100, 0.1, 1e-3))[0]
    rx, rw = torch.autograd.grad(ref, (xr, wr))
    for a, r in ((loss, ref), (gx, rx), (gw, rw)):
        assert _rel(a, r) <= TOL[dtype]


@pytest.mark.parametrize("chunk", [256, None], ids=["row-chunks", "class-major"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_triton_route_compiles_in_one_graph_with_inductor(reduction, chunk):
    torch.manual_seed(3)
    x = (torch.randn(700, 128, device="cuda") * 0.5).bfloat16().requires_grad_()
    w = (torch.randn(3001, 128, device="cuda") * 128**-0.5).bfloat16().requires_grad_()
    t = torch.randint(0, 3001, (700,), device="cuda")
    t[::9] = -100

    def f(x, w, t):
        out = linear_cross_entropy(torch.tanh(x), w, t, reduction=reduction, label_smoothing=0.1,
                                   implementation="triton", chunk_size=chunk)
        return out.square().sum() if reduction == "none" else out

    compiled = torch.compile(f, fullgraph=True)
    for _ in range(2):  # the second call reuses the graph
        got, eager = compiled(x, w, t), f(x, w, t)
        assert _rel(got, eager) <= 1e-5
        for a, b in zip(torch.autograd.grad(got, (x, w)), torch.autograd.grad(eager, (x, w))):
            assert _rel(a, b) <= 1e-2


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "class-weights"])
@pytest.mark.parametrize("chunk", [None, 128], ids=["class-major", "row-chunks"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_a_call_never_makes_the_host_wait_for_the_gpu(reduction, chunk, weighted):
    """Forward and backward return with earlier GPU work still queued (without class weights the
    loss's coefficients once used torch.tensor(C, device=cuda): a blocking copy that waited for
    the stream)."""
    n, h, v = 300, 64, 1000
    x = (torch.randn(n, h, device="cuda") * 0.5).bfloat16().requires_grad_()
    w = (torch.randn(v, h, device="cuda") * h**-0.5).bfloat16().requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")
    cw = torch.rand(v, device="cuda") + 0.5 if weighted else None

    def step() -> None:
        x.grad = w.grad = None
        out = linear_cross_entropy(x, w, t, reduction=reduction, chunk_size=chunk, label_smoothing=0.1,
                                   class_weight=cw, z_loss=1e-4)
        (out.sum() if reduction == "none" else out).backward()

    assert returns_while_the_gpu_is_busy(step)  # after two warm-up calls
    assert torch.isfinite(w.grad).all()
