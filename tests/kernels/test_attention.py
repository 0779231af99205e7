"""The attention function against SDPA / a float64 reference with the same dense mask."""
from __future__ import annotations

import math

import warnings

import pytest
import torch
import torch.nn.functional as F

from kernels.attention import (
    AttentionInputError,
    BlockMaskCache,
    FlexEagerFallbackError,
    FlexUnavailableError,
    attention,
    math_attention,
    select_backend,
)
from kernels.attention import masks as M

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MASKS = [
    None,
    M.causal(),
    M.sliding_window(17),
    M.sliding_window(9, causal=False),
    M.document_from_offsets([0, 33, 34, 90, 150]),
    M.prefix_lm(21),
    M.chunked_local(32),
    M.sliding_window(40) & M.document_from_offsets([0, 70, 150]),
]


def sdpa_ref(q, k, v, mask):
    """SDPA in float64 with an explicit dense mask and explicitly repeated KV heads."""
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, 1)
    v = v.repeat_interleave(g, 1)
    dense = None if mask is None else mask.dense(q.shape[2], k.shape[2], batch=q.shape[0], device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=dense)


def rand_qkv(b, hq, hkv, s, d, dtype=torch.float32, device="cpu", grad=True):
    gen = torch.Generator(device="cpu").manual_seed(torch.seed() % 2**31)
    mk = lambda h: torch.randn(b, h, s, d, generator=gen).to(device=device, dtype=dtype).requires_grad_(grad)
    return mk(hq), mk(hkv), mk(hkv)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("mask", MASKS, ids=repr)
@pytest.mark.parametrize("hq, hkv", [(4, 4), (4, 2)])
def test_output_and_grads_match_dense_sdpa_cpu(mask, hq, hkv):
    q, k, v = rand_qkv(2, hq, hkv, 150, 16)
    out = attention(q, k, v, mask)
    grad_out = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = sdpa_ref(q64, k64, v64, mask)
    rdq, rdk, rdv = torch.autograd.grad(ref, (q64, k64, v64), grad_out.double())
    assert rel(out, ref) < 1e-5
    for got, want in ((dq, rdq), (dk, rdk), (dv, rdv)):
        assert rel(got, want) < 1e-5


@pytest.mark.parametrize("mask", [M.causal(), M.sliding_window(13), M.document_from_offsets([0, 5, 77, 100])], ids=repr)
def test_lse_matches_logsumexp_reference(mask):
    q, k, v = rand_qkv(1, 4, 2, 100, 8)
    out, lse = attention(q, k, v, mask, return_lse=True)
    assert lse.shape == (1, 4, 100) and lse.dtype == torch.float32
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double().repeat_interleave(2, 1)) / math.sqrt(8)
    s = s.masked_fill(~mask.dense(100), float("-inf"))
    assert torch.allclose(lse.double(), torch.logsumexp(s, -1), atol=1e-5)
    assert rel(out, sdpa_ref(q.double(), k.double(), v.double(), mask)) < 1e-5
    # gradients flow through the LSE too
    (out.sum() + lse.sum()).backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_math_attention_empty_rows_give_zero_and_minus_inf():
    q, k, v = rand_qkv(1, 2, 2, 8, 4, grad=False)
    out, lse = math_attention(q, k, v, M.causal() & ~M.sliding_window(2))  # rows 0, 1 have no key
    assert torch.all(out[:, :, :2] == 0) and torch.all(torch.isneginf(lse[:, :, :2]))
    assert torch.isfinite(out).all()


def test_math_attention_without_queries_returns_empty_out_and_lse():
    """Sq = 0 failed in torch.cat on the empty list of query chunks (an untyped ValueError)."""
    q, k, v = torch.randn(2, 4, 0, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 6)
    out, lse = attention(q, k, v, M.causal(), return_lse=True)
    assert out.shape == (2, 4, 0, 6) and out.dtype == q.dtype
    assert lse.shape == (2, 4, 0) and lse.dtype == torch.float32


def test_math_attention_refuses_a_chunk_size_below_one():
    """chunk_size=-1 returned an output without queries; 0 failed in range() untyped."""
    q = torch.randn(1, 2, 5, 8)
    for bad in (-1, 0, 2.0):
        with pytest.raises(AttentionInputError, match="chunk_size"):
            math_attention(q, q, q, chunk_size=bad)


def test_scale_argument():
    q, k, v = rand_qkv(1, 2, 2, 40, 8, grad=False)
    m = M.sliding_window(5)
    a = attention(q, k, v, m, scale=0.1)
    b = attention(q * (0.1 * math.sqrt(8)), k, v, m)
    assert rel(a, b) < 1e-5


def test_scale_and_cache_of_the_wrong_type_raise_typed():
    """scale="0.5" failed inside SDPA and cache={} inside dict.get, both untyped TypeErrors."""
    q, k, v = rand_qkv(1, 2, 2, 16, 8, grad=False)
    with pytest.raises(AttentionInputError, match="scale must be a real number"):
        attention(q, k, v, scale="0.5")
    with pytest.raises(AttentionInputError, match="cache must be a BlockMaskCache"):
        attention(q, k, v, M.sliding_window(4), backend="flex", cache={})


def test_backend_selection_cpu():
    q, k, v = rand_qkv(1, 4, 2, 32, 8)
    with torch.no_grad():
        assert select_backend(q, k, v, M.sliding_window(4)) == "sdpa"  # CPU flex is opt-in
        assert select_backend(q, k, v, M.sliding_window(4), backend="flex") == "flex"
        assert select_backend(q, k, v, M.causal()) == "sdpa"
        assert select_backend(q, k, v, None) == "sdpa"
    assert select_backend(q, k, v, M.sliding_window(4)) == "sdpa"  # no flex backward on CPU
    assert select_backend(q, k, v, M.sliding_window(4), return_lse=True) == "math"
    assert select_backend(q, k, v, M.causal(), return_lse=True) == "math"
    with pytest.raises(FlexUnavailableError, match="no backward on CPU"):
        select_backend(q, k, v, M.sliding_window(4), backend="flex")
    with torch.no_grad(), pytest.raises(FlexUnavailableError, match="LSE"):
        select_backend(q, k, v, M.sliding_window(4), backend="flex", return_lse=True)
    with pytest.raises(AttentionInputError, match="LSE"):
        select_backend(q, k, v, M.causal(), backend="sdpa", return_lse=True)


def test_compiled_flex_cpu_inference_matches_reference():
    """Compiled flex (CPU inductor, forward only) on lengths that are not multiples of 128,
    with a composite mask and GQA; a second mask of the same kind reuses the compiled kernel."""
    cache = BlockMaskCache()
    q, k, v = rand_qkv(2, 4, 2, 200, 16, grad=False)
    for offsets in ([0, 50, 130, 200], [0, 99, 200]):
        mask = M.sliding_window(37) & M.document_from_offsets(offsets)
        out = attention(q, k, v, mask, backend="flex", cache=cache)
        assert rel(out, sdpa_ref(q.double(), k.double(), v.double(), mask)) < 1e-5
    assert cache.misses == 2 and len(cache) == 2
    attention(q, k, v, M.sliding_window(37) & M.document_from_offsets([0, 99, 200]), backend="flex", cache=cache)
    assert cache.hits == 1 and cache.misses == 2


def test_flex_inside_a_callers_compiled_graph_from_cold_caches(monkeypatch):
    """attention(backend="flex") traced by the caller's torch.compile(fullgraph=True) with no
    compiled flex wrapper and no block mask built yet: flex joins that graph (building the
    wrapper inside a trace broke it), the block mask is built in the graph and not cached."""
    from kernels.attention import functional

    monkeypatch.setattr(functional, "_COMPILED", {})
    cache = BlockMaskCache()
    q, k, v = rand_qkv(1, 2, 2, 200, 16, grad=False)
    mask = M.sliding_window(37)
    compiled = torch.compile(lambda q, k, v: attention(q, k, v, mask, backend="flex", cache=cache), fullgraph=True)
    assert rel(compiled(q, k, v), sdpa_ref(q.double(), k.double(), v.double(), mask)) < 1e-5
    assert len(cache) == 0 and functional._COMPILED == {}


def test_eager_flex_fallback_is_refused():
    q, k, v = rand_qkv(1, 2, 2, 64, 8, grad=False)
    with torch.compiler.set_stance("force_eager"), pytest.raises(FlexEagerFallbackError, match="64×64"):
        attention(q, k, v, M.sliding_window(8), backend="flex")


def test_flex_at_the_recompile_limit_raises_typed(monkeypatch):
    """Dynamo's recompile limit (a ninth length or window size by default) ended the compiled
    flex call with Dynamo's own FailOnRecompileLimitHit; it is the documented typed error."""
    import torch._dynamo

    from kernels.attention import functional

    monkeypatch.setattr(functional, "_COMPILED", {})
    q, k, v = rand_qkv(1, 2, 2, 48, 8, grad=False)
    with torch._dynamo.config.patch(recompile_limit=0), pytest.raises(FlexEagerFallbackError, match="recompile limit"):
        attention(q, k, v, M.sliding_window(8), backend="flex", cache=BlockMaskCache())


def test_block_mask_cache_lru_and_keys():
    cache = BlockMaskCache(max_entries=2)
    a = cache.get(M.sliding_window(8), 1, 2, 64, 64, "cpu")
    assert cache.get(M.sliding_window(8), 3, 5, 64, 64, "cpu") is a  # batch/head independent
    cache.get(M.sliding_window(8), 1, 2, 64, 64, "cpu", block_size=32)
    cache.get(M.causal(), 1, 2, 64, 64, "cpu")
    assert len(cache) == 2 and cache.misses == 3 and cache.hits == 1
    assert cache.get(M.causal(), 1, 1, 64, 64, "cpu") is not a
    doc = M.document(torch.zeros(2, 64, dtype=torch.long))
    cache.get(doc, 2, 4, 64, 64, "cpu")
    with pytest.raises(AttentionInputError, match="block_size"):
        cache.get(M.causal(), 1, 1, 64, 64, "cpu", block_size=100)
    with pytest.raises(AttentionInputError, match="q_len"):
        cache.get(M.causal(), 1, 1, 0, 64, "cpu")
    for bad in (0, 2.5, "8"):  # 2.5 was taken, "8" failed comparing str with int
        with pytest.raises(AttentionInputError, match="max_entries"):
            BlockMaskCache(max_entries=bad)


def test_compiled_block_mask_build_matches_eager_and_does_not_warn():
    """The compiled build (default on CUDA) gives the eager build's blocks, without the
    DeprecationWarning of create_block_mask's ``_compile`` flag, which it once passed."""
    mask = M.sliding_window(37) & M.document_from_offsets([0, 70, 200])
    eager = BlockMaskCache(compile=False).get(mask, 1, 1, 200, 200, "cpu", block_size=32)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*_compile flag", category=DeprecationWarning)
        compiled = BlockMaskCache(compile=True).get(mask, 1, 1, 200, 200, "cpu", block_size=32)
    assert torch.equal(compiled.to_dense(), eager.to_dense())
    assert torch.equal(compiled.kv_num_blocks, eager.kv_num_blocks)


@pytest.mark.parametrize(
    "args, match",
    [
        (lambda: (torch.randn(2, 8, 4), torch.randn(2, 8, 4), torch.randn(2, 8, 4)), "shape \\(B, H, S, D\\)"),
        (lambda: (torch.randn(1, 3, 8, 4), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4)), "multiple of key/value heads"),
        (lambda: (torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4).double(), torch.randn(1, 2, 8, 4)), "dtypes differ"),
        (lambda: (torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 5), torch.randn(1, 2, 8, 5)), "head dims differ"),
        (lambda: (torch.randn(2, 2, 8, 4), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4)), "batch sizes differ"),
        (lambda: (torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 9, 4)), "share heads and length"),
        (lambda: (torch.ones(1, 2, 8, 4, dtype=torch.long),) * 3, "floating point"),
    ],
)
def test_bad_inputs_raise(args, match):
    with pytest.raises(AttentionInputError, match=match):
        attention(*args())


def test_bad_mask_and_backend_raise():
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(AttentionInputError, match="mask must be"):
        attention(q, q, q, "causal")
    with pytest.raises(AttentionInputError, match="backend must be"):
        attention(q, q, q, None, backend="cudnn")
    assert issubclass(AttentionInputError, ValueError)


# --- GPU ------------------------------------------------------------------------------------


@cuda
@pytest.mark.parametrize("mask", [M.causal(), M.sliding_window(64), M.document_from_offsets([0, 100, 333, 700]),
                                  M.sliding_window(100) & M.prefix_lm(50)], ids=repr)
def test_flex_bf16_matches_sdpa_gpu(mask):
    q, k, v = rand_qkv(2, 8, 2, 700, 64, dtype=torch.bfloat16, device="cuda")
    out, lse = attention(q, k, v, mask, backend="flex", return_lse=True)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = sdpa_ref(q64, k64, v64, mask)
    rgrads = torch.autograd.grad(ref, (q64, k64, v64), g.double())
    assert rel(out, ref) < 1e-2
    for a, b in zip(grads, rgrads):
        assert rel(a, b) < 2e-2
    _, rlse = math_attention(q64.detach(), k64.detach(), v64.detach(), mask)
    assert torch.allclose(lse.double(), rlse.double(), atol=2e-2)


@cuda
@pytest.mark.parametrize("mask", [M.sliding_window(128), M.causal()], ids=repr)
def test_deterministic_backward_bit_identical_gpu(mask):
    q, k, v = rand_qkv(1, 8, 2, 2048, 64, dtype=torch.bfloat16, device="cuda")
    g = torch.randn(1, 8, 2048, 64, device="cuda", dtype=torch.bfloat16)
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = []
        for _ in range(2):
            out = attention(q, k, v, mask)
            runs.append(torch.autograd.grad(out, (q, k, v), g))
    finally:
        torch.use_deterministic_algorithms(prev)
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_sdpa_backend_is_right_on_a_misaligned_view(device):
    # torch 2.11's SDPA with a boolean mask returned rel. error 1.41 for a bf16 view starting 2
    # bytes past a 16-byte boundary on an H200; the sdpa backend now hands it an aligned copy
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(3)
    storage = torch.randn(2 * 4 * 640 * 64 + 1, device=device, dtype=dtype)
    view = storage[1:].view(2, 4, 640, 64)
    assert view.is_contiguous() and view.data_ptr() % 16
    leaf = view.detach().requires_grad_()
    out = attention(leaf, leaf, leaf, M.sliding_window(128), backend="sdpa")
    (grad,) = torch.autograd.grad(out, leaf, torch.ones_like(out))
    ref_leaf = view.detach().double().requires_grad_()
    ref, _ = math_attention(ref_leaf, ref_leaf, ref_leaf, M.sliding_window(128))
    (ref_grad,) = torch.autograd.grad(ref, ref_leaf, torch.ones_like(ref))
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert float((out.detach().double() - ref.detach()).norm() / ref.detach().norm()) <= tol
    assert float((grad.double() - ref_grad).norm() / ref_grad.norm()) <= tol
