"""The Llama-style model: shapes, loss paths, training signal, config validation, smoke bench."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from kernels.attention import masks as M
from kernels.model import Llama, LlamaConfig, ModelConfigError, apply_rope, fused_loss_available, lm_loss

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_logits_shape_and_loss_matches_cross_entropy_on_logits():
    torch.manual_seed(0)
    cfg = LlamaConfig.tiny(loss_impl="torch")
    model = Llama(cfg)
    tok = torch.randint(0, cfg.vocab_size, (2, 33))
    logits = model(tok[:, :-1])
    assert logits.shape == (2, 32, cfg.vocab_size)
    loss = model(tok[:, :-1], tok[:, 1:])
    want = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), tok[:, 1:].reshape(-1))
    assert torch.allclose(loss, want, rtol=1e-5)
    # untrained model: loss near log(V)
    assert abs(loss.item() - torch.log(torch.tensor(float(cfg.vocab_size))).item()) < 0.5


@pytest.mark.skipif(not fused_loss_available(), reason="kernels.lce not importable")
def test_fused_loss_matches_torch_loss_and_grads():
    torch.manual_seed(1)
    tok = torch.randint(0, 512, (2, 41))
    losses, grads = [], []
    for impl in ("torch", "fused"):
        torch.manual_seed(2)
        model = Llama(LlamaConfig.tiny(loss_impl=impl))
        loss = model(tok[:, :-1], tok[:, 1:])
        loss.backward()
        losses.append(loss.detach())
        grads.append(model.embed.weight.grad.clone())
    assert torch.allclose(losses[0], losses[1], rtol=1e-5)
    assert (grads[0] - grads[1]).norm() / grads[0].norm() < 1e-4


def test_lm_loss_ignore_index_and_errors():
    h = torch.randn(6, 8)
    w = torch.randn(10, 8)
    t = torch.tensor([1, -100, 3, 4, -100, 9])
    got = lm_loss(h, w, t, impl="torch")
    keep = t != -100
    assert torch.allclose(got, F.cross_entropy(h[keep] @ w.T, t[keep]))
    with pytest.raises(ModelConfigError, match="targets 5"):
        lm_loss(h, w, t[:5])


@pytest.mark.parametrize("window", [None, 8])
def test_loss_decreases_over_cpu_steps(window):
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny(attn_window=window))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tok = torch.randint(0, 512, (4, 49))
    losses = []
    for _ in range(12):
        loss = model(tok[:, :-1], tok[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    assert all(b < a for a, b in zip(losses[:6], losses[1:7]))


@pytest.mark.parametrize("loss_impl", ["fused", "torch"])
def test_model_compiles_in_one_graph_with_the_eager_numbers(loss_impl):
    # fullgraph: attention (a window as SDPA's dense mask on CPU) and the fused loss trace
    # without breaks (before, the operands' alignment check read data_ptr() and broke the graph)
    torch.manual_seed(0)
    cfg = LlamaConfig.tiny(max_seq_len=64).replace(attn_window=8, attn_backend="sdpa", loss_impl=loss_impl)
    model = Llama(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 40))
    params = [p for p in model.parameters() if p.requires_grad]
    eager = model(ids, ids)
    eager_grads = torch.autograd.grad(eager, params)
    torch._dynamo.reset()
    got = torch.compile(model, backend="aot_eager", fullgraph=True)(ids, ids)
    assert torch.allclose(got, eager, rtol=1e-6, atol=0)
    for a, b in zip(torch.autograd.grad(got, params), eager_grads):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_window_limits_what_a_position_sees():
    """Changing a token outside every later position's window (through all layers) leaves
    those positions' logits unchanged; inside the window it changes them."""
    torch.manual_seed(0)
    cfg = LlamaConfig.tiny(attn_window=4, n_layers=2)  # receptive field 2 * (4 - 1) = 6 back
    model = Llama(cfg).eval()
    tok = torch.randint(0, 512, (1, 30))
    other = tok.clone()
    other[0, 5] = (tok[0, 5] + 1) % 512
    with torch.no_grad():
        a, b = model(tok), model(other)
    assert torch.allclose(a[0, 12:], b[0, 12:], atol=1e-6)  # 12 - 5 > 6
    assert not torch.allclose(a[0, 5:8], b[0, 5:8])


@pytest.mark.parametrize("window", [None, 6])
def test_no_position_sees_the_future(window):
    """Changing token t changes no logits before t, with and without autograd."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny(attn_window=window))
    tok = torch.randint(0, 512, (1, 24))
    other = tok.clone()
    other[0, 15] = (tok[0, 15] + 3) % 512
    with torch.no_grad():
        a, b = model(tok), model(other)
    assert torch.allclose(a[0, :15], b[0, :15], atol=1e-6)
    assert not torch.allclose(a[0, 15], b[0, 15])
    a, b = model(tok), model(other)  # grad mode
    assert torch.allclose(a[0, :15], b[0, :15], atol=1e-6)


def test_callable_attention_package():
    import kernels

    q = torch.randn(1, 2, 10, 4)
    assert torch.allclose(kernels.attention(q, q, q, M.causal()), kernels.attention.attention(q, q, q, M.causal()))


def test_document_mask_override_isolates_documents():
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny()).eval()
    tok = torch.randint(0, 512, (1, 20))
    other = tok.clone()
    other[0, 3] = (tok[0, 3] + 7) % 512
    docs = M.document_from_offsets([0, 10, 20])
    with torch.no_grad():
        a, b = model(tok, mask=docs), model(other, mask=docs)
    assert torch.allclose(a[0, 10:], b[0, 10:], atol=1e-6)
    assert not torch.allclose(a[0, 3:10], b[0, 3:10])


def test_rope_is_a_rotation_and_relative():
    x = torch.randn(1, 16, 2, 8)
    from kernels.model import _rope_tables

    cos, sin = _rope_tables(8, 16, 10000.0)
    y = apply_rope(x, cos, sin)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert torch.allclose(y[:, 0], x[:, 0])  # position 0 is not rotated
    # scores depend on relative position only: same vectors at (3, 1) and (9, 7)
    q = torch.randn(8)
    k = torch.randn(8)
    seq = torch.zeros(1, 16, 1, 8)
    seq[0, 3, 0], seq[0, 9, 0] = q, q
    kseq = torch.zeros(1, 16, 1, 8)
    kseq[0, 1, 0], kseq[0, 7, 0] = k, k
    rq, rk = apply_rope(seq, cos, sin), apply_rope(kseq, cos, sin)
    assert torch.allclose(rq[0, 3, 0] @ rk[0, 1, 0], rq[0, 9, 0] @ rk[0, 7, 0], atol=1e-5)


def test_param_and_flop_accounting():
    cfg = LlamaConfig.llama_1b()
    assert cfg.head_dim == 64 and cfg.kv_heads == 8 and cfg.hidden_dim == 8192
    # per layer: qkv 2048*(32+16)*64, out 2048*2048, mlp 3*2048*8192; plus LM head 2048*128256
    per_layer = 2048 * 48 * 64 + 2048 * 2048 + 3 * 2048 * 8192
    assert cfg.matmul_params() == 16 * per_layer + 2048 * 128256
    tiny = LlamaConfig.tiny()
    model = Llama(tiny)
    # tied head: matmul params + the two RMSNorm scales per layer + the final norm
    assert model.num_params() == tiny.matmul_params() + 2 * tiny.n_layers * tiny.dim + tiny.dim
    s = 64
    w = LlamaConfig.tiny(attn_window=8)
    pairs = sum(min(q + 1, 8) for q in range(s))
    expect = 6 * w.matmul_params() * 2 * s + 12 * w.head_dim * w.n_heads * w.n_layers * 2 * pairs
    assert w.train_flops(2, s) == expect


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dim": 65}, "divisible by n_heads"),
        ({"n_kv_heads": 3}, "multiple of n_kv_heads"),
        ({"vocab_size": 0}, "vocab_size must be a positive int"),
        ({"attn_window": -2}, "attn_window"),
        ({"loss_impl": "liger"}, "loss_impl"),
        ({"attn_backend": "xformers"}, "attn_backend"),
        ({"dim": 36, "n_heads": 12, "n_kv_heads": 4}, "head_dim \\(3\\) must be even"),
        ({"norm_eps": 0.0}, "positive"),
        ({"rope_theta": "1e4"}, "rope_theta must be a positive number"),  # failed comparing str with int
        ({"tie_embeddings": "no"}, "tie_embeddings must be a bool"),  # was taken as true: tied
    ],
)
def test_bad_config_raises(kwargs, match):
    with pytest.raises(ModelConfigError, match=match):
        LlamaConfig.tiny(**kwargs)


def test_bad_forward_inputs_raise():
    model = Llama(LlamaConfig.tiny(max_seq_len=16))
    with pytest.raises(ModelConfigError, match="exceeds max_seq_len"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ModelConfigError, match="int tensor of shape"):
        model(torch.zeros(1, 4))
    with pytest.raises(ModelConfigError, match="targets shape"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ModelConfigError, match="takes a LlamaConfig"):
        Llama({"dim": 4})


def test_step_bench_smoke(tmp_path):
    out = tmp_path / "step.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "step_bench.py"), "--smoke", "--json", str(out)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    rows = data["results"]
    assert [r["config"] for r in rows] == ["baseline", "fused_loss", "flex", "fused+flex", "causal_flash"]
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["step_s"] > 0 and r["useful_tflop"] > 0
        assert abs(r["first_loss"] - 6.24) < 0.5  # log(512) at init
    assert "step_bench" in proc.stdout and "MFU" in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend, compiled", [("triton_window", False), ("flex", False), ("sdpa", False),
                                               ("triton_window", True), ("flex", True)])
def test_a_training_step_never_makes_the_host_wait_for_the_gpu(backend, compiled):
    """Forward, backward, gradient clipping and an AdamW step of the model (fused loss, a window
    kernel / flex / SDPA; eagerly, or the model under torch.compile, where the fused loss and
    the window kernel run as custom operators) all return with earlier GPU work still queued."""
    from tests.helpers.cuda import returns_while_the_gpu_is_busy

    torch.manual_seed(0)
    cfg = LlamaConfig.tiny(dim=128, n_heads=2, n_kv_heads=1, max_seq_len=512).replace(
        attn_window=128, attn_backend=backend, loss_impl="fused")
    model = Llama(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(0, cfg.vocab_size, (2, 385), device="cuda")
    forward = torch.compile(model, fullgraph=True) if compiled else model

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward(ids[:, :-1], ids[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    assert returns_while_the_gpu_is_busy(step)  # after two warm-up steps (optimizer state, masks)
    assert all(torch.isfinite(p).all() for p in model.parameters())
