"""The dedicated causal sliding-window Triton kernel (``attention(backend="triton_window")``):
output, LSE and gradients against the float64 reference, in Triton's CPU interpreter (a
subprocess: ``TRITON_INTERPRET`` is read when kernels are defined), and in bf16 on a GPU."""
from __future__ import annotations

import os

import pytest
import torch

import kernels.attention.window_triton as wt
from kernels.attention import attention
from kernels.attention.errors import AttentionInputError
from kernels.attention.masks import Causal, SlidingWindow
from tests.helpers.cuda import returns_while_the_gpu_is_busy
from tests.helpers.triton_interpreter import HAS_TRITON, assert_runs_interpreted

SCRIPT = r'''
import random, torch
import kernels.attention.window_triton as wt
from kernels.attention import attention
from kernels.attention.masks import SlidingWindow
from kernels.attention.reference import math_attention
seed = random.SystemRandom().randrange(2**31); torch.manual_seed(seed)
worst = {}
B = wt.Blocks
interpreter_config = wt.window_config
# (config, (batch, query heads, kv heads, length, head dim, window)): lengths off the block grid,
# GQA, a window wider than the sequence, a window of one (each query sees itself only), lengths
# and windows on the block grid (interior spans everywhere); then GPU-sized blocks, query and key
# blocks of different sizes (the span arithmetic differs per kernel), TMA descriptor loads (rows
# past a head's end then belong to the next head, or to no tensor: batch 2 puts heads behind it),
# dQ both from stored dS and recomputed, and the dK/dV kernel on transposed tiles (its key-major
# dS read by dQ, and dQ recomputed)
T = dict(tma=True)
CASES = [(None, (1, 2, 1, 37, 16, 5)), (None, (2, 4, 2, 50, 32, 17)), (None, (1, 1, 1, 20, 16, 64)),
         (None, (1, 2, 2, 19, 16, 1)), (None, (1, 2, 1, 96, 16, 48)),
         (wt.WindowConfig(B(64, 64, 4), B(32, 64, 4), B(64, 32, 4)), (1, 4, 1, 200, 64, 40)),
         (wt.WindowConfig(B(128, 64, 8), B(64, 128, 8), B(128, 32, 8), B(64, 128, 4)), (1, 2, 2, 300, 32, 129)),
         (wt.WindowConfig(B(32, 32, 4), B(32, 32, 4), B(32, 32, 4), B(32, 32, 4)), (1, 2, 1, 256, 32, 64)),
         (wt.WindowConfig(B(16, 16, 1, 1, **T), B(16, 16, 1, 1, **T), B(16, 16, 1, 1, **T)), (2, 2, 1, 37, 16, 5)),
         (wt.WindowConfig(B(64, 32, 4, **T), B(32, 64, 4, **T), B(64, 32, 4, **T), B(32, 64, 4, **T)),
          (2, 2, 2, 300, 32, 129)),
         (wt.WindowConfig(B(16, 16, 1, 1, **T), B(16, 16, 1, 1, **T), B(16, 16, 1, 1, **T), B(16, 16, 1, 1, **T),
                          dkdv_transposed=True), (2, 4, 2, 50, 32, 17)),
         (wt.WindowConfig(B(16, 16, 1, 1), B(32, 16, 1, 1), B(16, 32, 1, 1), B(16, 16, 1, 1), dkdv_transposed=True),
          (1, 2, 1, 37, 16, 5)),
         (wt.WindowConfig(B(16, 16, 1, 1), B(16, 32, 1, 1), B(16, 16, 1, 1), dkdv_transposed=True),
          (1, 2, 2, 19, 16, 1))]
for config, case in CASES:
    wt.window_config = interpreter_config if config is None else (lambda dev, d, config=config: config)
    b, hq, hkv, s, d, w = case
    q = torch.randn(b, hq, s, d, requires_grad=True); k = torch.randn(b, hkv, s, d, requires_grad=True)
    v = torch.randn(b, hkv, s, d, requires_grad=True)
    out, lse = attention(q, k, v, SlidingWindow(w), backend="triton_window", return_lse=True)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, ref_lse = math_attention(*leaves, SlidingWindow(w), scale=1.0 / d ** 0.5)
    ref_grads = torch.autograd.grad(ref, leaves, g.double())
    for name, a, r in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads), (ref, ref_lse, *ref_grads)):
        # relative, except where the reference is ~0 (window 1: softmax of one score, dq = dk = 0)
        err = float((a.detach().double() - r.detach()).norm() / max(float(r.detach().norm()), 1.0))
        worst[name] = max(worst.get(name, 0.0), err)
# the model routes its attention through the kernel: same loss and gradients as SDPA's dense window
from kernels.model import Llama, LlamaConfig
wt.window_config = interpreter_config
grads = {}
for backend in ("sdpa", "triton_window"):
    torch.manual_seed(seed)
    model = Llama(LlamaConfig.tiny(max_seq_len=64).replace(attn_window=8, attn_backend=backend, loss_impl="torch"))
    ids = torch.randint(0, model.cfg.vocab_size, (1, 40))
    model(ids).float().pow(2).mean().backward()
    grads[backend] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
worst["model"] = float((grads["triton_window"] - grads["sdpa"]).norm() / grads["sdpa"].norm())
# no double backward: create_graph=True once gave gradients that autograd took for constants
from kernels.attention.errors import AttentionError
q = torch.randn(1, 2, 20, 16, requires_grad=True)
try:
    torch.autograd.grad(attention(q, q, q, SlidingWindow(4), backend="triton_window").sum(), q, create_graph=True)
    raise AssertionError("double backward was not refused")
except AttentionError as exc:
    assert "create_graph=True" in str(exc), exc
print("seed", seed, "worst", worst)
assert max(worst.values()) <= 1e-5, worst
'''


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_window_kernel_under_interpreter_matches_float64_reference() -> None:
    assert_runs_interpreted(SCRIPT, "worst")


def test_gpus_without_tma_get_the_same_shapes_with_pointer_loads() -> None:
    for cfg in wt.GPU_CONFIGS.values():
        plain = wt.pointer_loads(cfg)
        for name in ("fwd", "dkdv", "dq", "dq_from_ds"):
            shipped, fallback = getattr(cfg, name), getattr(plain, name)
            assert (shipped is None) == (fallback is None)
            if shipped is not None:
                assert not fallback.tma and (fallback.block_m, fallback.block_n, fallback.warps,
                                             fallback.stages) == (shipped.block_m, shipped.block_n, shipped.warps,
                                                                  shipped.stages)


def test_ds_layout_counts_the_key_blocks_every_query_block_reaches() -> None:
    import random

    rng = random.Random(0)
    for _ in range(500):
        s, w = rng.randint(1, 700), rng.randint(1, 300)
        bm, bn = rng.choice([16, 32, 64, 128]), rng.choice([16, 32, 64, 128])
        nqb = -(-s // bm)
        reach = [(min(i * bm + bm, s) - 1) // bn - max(i * bm - w + 1, 0) // bn + 1 for i in range(nqb)]
        assert wt.ds_layout(s, w, wt.Blocks(bm, bn)) == (nqb, max(reach)), (s, w, bm, bn)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_launchers_refuse_what_their_kernels_cannot_take() -> None:
    q = torch.randn(1, 2, 64, 16)
    with pytest.raises(AttentionInputError, match="contiguous"):
        wt._operand(q.transpose(1, 2), 16, tma=True)
    blocks = wt.Blocks(16, 16)
    wrong = torch.empty(2, 4, 3, 16, 16)  # layout for S=64, window 8 is 4 query blocks x 2 slots
    with pytest.raises(AttentionInputError, match="was not written with blocks"):
        wt.launch_dq_from_ds(q, q, wrong, 8, 0.25, blocks)


def test_window_backend_refuses_what_it_cannot_compute() -> None:
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(AttentionInputError, match="causal SlidingWindow"):
        attention(q, q, q, Causal(), backend="triton_window")
    with pytest.raises(AttentionInputError, match="causal SlidingWindow"):
        attention(q, q, q, SlidingWindow(4, causal=False), backend="triton_window")
    if os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(AttentionInputError, match="CUDA"):
            attention(q, q, q, SlidingWindow(4), backend="triton_window")


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_window_backend_refuses_dtypes_it_cannot_compute(monkeypatch) -> None:
    """float64 failed an assertion inside Triton's compiler; bf16 under the CPU interpreter
    returned outputs of ~1e9 without an error."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(AttentionInputError, match="float16, bfloat16 or float32, got torch.float64"):
        attention(*(q.double(),) * 3, SlidingWindow(4), backend="triton_window")
    with pytest.raises(AttentionInputError, match="interpreter computes bfloat16"):
        attention(*(q.bfloat16(),) * 3, SlidingWindow(4), backend="triton_window")



@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_window_backend_refuses_operands_past_32_bit_offsets(monkeypatch) -> None:
    """A head's base offset is a 32-bit product in the kernels: past 2**31 elements it wrapped.
    (An expanded view: the size without the memory.)"""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q = torch.zeros(1, 1, 1, 16).expand(2**13, 16, 2**10, 16)  # 2**31 elements
    assert "32-bit offsets" in (wt.unsupported(q, q, q, 4) or "")
    assert wt.unsupported(q[:, :, :-1], q[:, :, :-1], q[:, :, :-1], 4) is None


_B, _C = wt.Blocks, wt.WindowConfig
#: every form of each kernel, on a GPU: pointer loads, TMA loads, dQ from stored dS and recomputed, dK/dV on untransposed tiles and on transposed ones with pointer loads
#: (beside the shipped configuration: transposed tiles, TMA loads)
GPU_FORMS = {
    "pointers+ds": _C(_B(64, 32, 4, 2), _B(64, 64, 4, 2), _B(64, 64, 4, 2), _B(64, 64, 4, 2)),
    "tma+recompute": _C(_B(64, 32, 4, 2, tma=True), _B(64, 64, 4, 2, tma=True), _B(64, 64, 4, 2, tma=True)),
    "tma+ds": _C(_B(64, 64, 4, 3, tma=True), _B(64, 64, 4, 2, tma=True), _B(64, 64, 4, 2, tma=True),
                 _B(64, 64, 4, 4, tma=True)),
    "pointers+recompute": _C(_B(64, 64, 4, 2), _B(64, 64, 4, 2), _B(64, 64, 4, 2)),
    "pointers+ds+transposed": _C(_B(64, 64, 4, 2), _B(64, 64, 4, 2), _B(64, 64, 4, 2), _B(64, 64, 4, 2),
                                 dkdv_transposed=True),
}


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs a CUDA GPU and triton")
@pytest.mark.parametrize("form,d", [*((f, d) for f in ("shipped", *GPU_FORMS) for d in (64, 128)),
                                    # the other head dims the kernel takes run the nearest shipped shapes
                                    ("shipped", 16), ("shipped", 32), ("shipped", 256)])
def test_window_kernel_bf16_on_gpu_matches_sdpa_with_the_dense_mask(form: str, d: int, monkeypatch) -> None:
    if form != "shipped":
        monkeypatch.setattr(wt, "window_config", lambda dev, dim: GPU_FORMS[form])
    torch.manual_seed(0)
    b, hq, hkv, s, w = 2, 8, 2, 1000, 256  # batch 2 and a ragged length: TMA rows cross heads
    q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = attention(q, k, v, SlidingWindow(w), backend="triton_window")
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref = attention(q, k, v, SlidingWindow(w), backend="sdpa")
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    for a, r in zip((out, *grads), (ref, *ref_grads)):
        assert float((a.detach().float() - r.detach().float()).norm() / r.detach().float().norm()) <= 1e-2


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs a CUDA GPU and triton")
@pytest.mark.parametrize("form", ["shipped", *GPU_FORMS])
def test_window_kernel_backward_is_bit_identical_run_to_run_on_gpu(form: str, monkeypatch) -> None:
    if form != "shipped":
        monkeypatch.setattr(wt, "window_config", lambda dev, dim: GPU_FORMS[form])
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn_like(q)
    runs = [torch.autograd.grad(attention(q, k, v, SlidingWindow(256), backend="triton_window"), (q, k, v), g)
            for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs a CUDA GPU and triton")
def test_window_kernel_compiles_in_one_graph_with_inductor_on_gpu() -> None:
    torch.manual_seed(2)
    q = torch.randn(2, 8, 1000, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 2, 1000, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    g = torch.randn_like(q)

    def f(q, k, v):
        return attention(q * 1.5, k, v, SlidingWindow(256), backend="triton_window").float().tanh()

    compiled = torch.compile(f, fullgraph=True)
    for out in (compiled(q, k, v), compiled(q, k, v)):  # the second call reuses the graph
        eager = f(q, k, v)
        assert torch.allclose(out, eager, atol=2e-2, rtol=0)
        for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(eager, (q, k, v), g)):
            assert float((a.float() - b.float()).norm() / b.float().norm()) <= 1e-2


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs a CUDA GPU and triton")
def test_auto_takes_the_window_kernel_for_causal_windows_in_half_precision_on_cuda() -> None:
    from kernels.attention import select_backend

    q = torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16)
    assert select_backend(q, q, q, SlidingWindow(32)) == "triton_window"
    assert select_backend(q.half(), q.half(), q.half(), SlidingWindow(32)) == "triton_window"
    assert select_backend(q, q, q, SlidingWindow(32, causal=False)) != "triton_window"
    assert select_backend(q.float(), q.float(), q.float(), SlidingWindow(32)) != "triton_window"  # tf32 dots
    odd = torch.randn(1, 4, 256, 48, device="cuda", dtype=torch.bfloat16)  # head dim not a power of two
    assert select_backend(odd, odd, odd, SlidingWindow(32)) != "triton_window"
    untuned = torch.randn(1, 4, 256, 32, device="cuda", dtype=torch.bfloat16)  # runs, but never measured
    assert select_backend(untuned, untuned, untuned, SlidingWindow(32)) != "triton_window"
    assert select_backend(untuned, untuned, untuned, SlidingWindow(32), backend="triton_window") == "triton_window"


TUNE_SCRIPT = r'''
import json, runpy, sys, tempfile
out = tempfile.mktemp(suffix=".json")
sys.argv = ["window_tune.py", "--device", "cpu", "--seq", "40", "--heads", "2", "--kv-heads", "1", "--dim", "16",
            "--window", "12", "--candidates", "1", "--no-flex", "--json", out,
            "--baseline", "kernels/attention/window_triton.py", "--kernels", "fwd", "dkdv", "dq", "dqds",
            "delta"]
try:
    runpy.run_path("benchmarks/diagnostics/window_tune.py", run_name="__main__")
except SystemExit as exit_:
    assert exit_.code == 0, exit_.code
result = json.load(open(out))
assert {r["kernel"] for r in result["rows"] if "ms" in r} == {"fwd", "dkdv", "dq", "dqds", "delta"}, \
    result["rows"]
assert all(r["rel_err"] <= 1e-5 for r in result["rows"]), result["rows"]
assert set(result["whole"]) == {"window_shipped", "window_tuned", "window_tuned_recompute_dq", "baseline"}, \
    result["whole"]
assert all("fwdbwd_ms" in r for r in result["whole"].values()), result["whole"]
print("ok")
'''


MISALIGNED_SCRIPT = r'''
import torch
import kernels.attention.window_triton as wt
from kernels.attention import attention
from kernels.attention.masks import SlidingWindow
from kernels.attention.reference import math_attention
T = dict(tma=True)
cfg = wt.WindowConfig(wt.Blocks(16, 16, 1, 1, **T), wt.Blocks(16, 16, 1, 1, **T), wt.Blocks(16, 16, 1, 1, **T),
                      wt.Blocks(16, 16, 1, 1, **T))
wt.window_config = lambda dev, d: cfg
torch.manual_seed(0)
n = 1 * 2 * 40 * 16
storage = torch.randn(3 * n + 1, dtype=torch.float64).float()
# contiguous views whose data starts 4 bytes past a 16-byte boundary: TMA descriptors refuse them
q, k, v = (storage[1 + i * n: 1 + (i + 1) * n].view(1, 2, 40, 16).requires_grad_() for i in range(3))
assert q.is_contiguous() and q.data_ptr() % 16 != 0
out = attention(q, k, v, SlidingWindow(7), backend="triton_window")
g = torch.randn(n + 1)[1:].view_as(out)  # the incoming gradient misaligned too
grads = torch.autograd.grad(out, (q, k, v), g)
leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
ref, _ = math_attention(*leaves, SlidingWindow(7), scale=0.25)
ref_grads = torch.autograd.grad(ref, leaves, g.double())
for a, r in zip((out, *grads), (ref, *ref_grads)):
    assert float((a.double() - r).norm() / r.norm()) <= 1e-5
print("ok")
'''


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_misaligned_inputs_are_copied_to_an_aligned_base_under_the_interpreter() -> None:
    assert_runs_interpreted(MISALIGNED_SCRIPT)


COMPILE_SCRIPT = r'''
import torch
from kernels.attention import attention
from kernels.attention.masks import SlidingWindow
torch.manual_seed(0)
q = torch.randn(1, 4, 40, 16, requires_grad=True)
k, v = (torch.randn(1, 2, 40, 16, requires_grad=True) for _ in range(2))
g = torch.randn(1, 4, 40, 16)
def f(q, k, v):
    out, lse = attention(q * 1.5, k, v, SlidingWindow(9), backend="triton_window", return_lse=True)
    return out.tanh(), lse
eager = f(q, k, v)
# fullgraph: one graph, the kernels an opaque operator in it (a Function of Triton launches broke it)
compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
got = compiled(q, k, v)
assert not got[1].requires_grad  # the LSE is not differentiable, as in eager mode
# the compiled graph runs the same kernels; the ops around them may be scheduled differently
# (bitwise equal on this machine alone, 2.4e-5 apart for the output in one full suite run of
# 2026-12-04 under load, not reproduced since), so: equal well within what a wrong graph (a
# wrong scale, mask or operand) would change
names = ("out", "lse", "dq", "dk", "dv")
for name, a, b in zip(names, (*got, *torch.autograd.grad(got[0], (q, k, v), g)),
                      (*eager, *torch.autograd.grad(eager[0], (q, k, v), g))):
    err = float((a.double() - b.double()).norm() / b.double().norm())
    assert err <= 1e-4, f"{name}: compiled vs eager relative error {err:.3g}"
# a model routing its attention through the kernel compiles in one graph too
from kernels.model import Llama, LlamaConfig
model = Llama(LlamaConfig.tiny(max_seq_len=64).replace(attn_window=8, attn_backend="triton_window", loss_impl="torch"))
ids = torch.randint(0, model.cfg.vocab_size, (1, 40))
eager = model(ids, ids)
torch._dynamo.reset()
got = torch.compile(model, backend="aot_eager", fullgraph=True)(ids, ids)
assert torch.allclose(got, eager, rtol=1e-6, atol=0), f"model loss compiled {float(got)!r} vs eager {float(eager)!r}"
print("ok")
'''


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_window_kernel_compiles_in_one_graph_under_the_interpreter() -> None:
    assert_runs_interpreted(COMPILE_SCRIPT)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_block_search_script_runs_and_checks_every_candidate_under_the_interpreter() -> None:
    assert_runs_interpreted(TUNE_SCRIPT)


def _bundled_ptxas() -> bool:
    if not HAS_TRITON:
        return False
    import triton

    return os.access(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"), os.X_OK)


@pytest.mark.skipif(not _bundled_ptxas(), reason="needs Triton with its bundled ptxas")
def test_static_resource_report_assembles_with_the_ptxas_triton_compiles_for(tmp_path) -> None:
    # TorchInductor points TRITON_PTXAS_PATH at torch's own ptxas in any process it compiled in;
    # Triton then writes PTX for that assembler, and the report's hard-wired bundled ptxas refused
    # it (seen in the kernels suite on an H200). The report must run the one Triton uses.
    import subprocess
    import sys

    import triton

    bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    log = tmp_path / "calls.log"
    wrapper = tmp_path / "ptxas"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {bundled} "$@"\n')
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_PTXAS_PATH"] = str(wrapper)
    proc = subprocess.run([sys.executable, "benchmarks/diagnostics/window_static.py", "--dim", "64", "--kernels", "fwd",
                           "--fwd-shapes", "64x32/w4/s2", "--json", str(tmp_path / "static.json")],
                          capture_output=True, text=True, timeout=300, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--gpu-name=sm_90a" in log.read_text()


@pytest.mark.skipif(not _bundled_ptxas(), reason="needs Triton with its bundled ptxas")
def test_static_resource_report_reads_registers_and_spills_from_the_compiler(tmp_path) -> None:
    import json
    import subprocess
    import sys

    out = tmp_path / "static.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "benchmarks/diagnostics/window_static.py", "--dim", "64", "--kernels", "fwd", "dq",
                           "--fwd-shapes", "64x32/w4/s2", "--dq-shapes", "64x32/w4/s2/tma", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["kernel"] for r in rows] == ["fwd", "dq"]
    for row in rows:
        assert "error" not in row, row
        assert 0 < row["registers"] <= 255 and row["shared_bytes"] > 0, row
        assert row["spill_stores"] >= 0 and row["spill_loads"] >= 0, row
    # compiled as a launch specializes (aligned tensors, strides of 16): the pointer loads of the
    # key loop are software-pipelined asynchronous copies, the TMA kernel's are bulk tensor copies
    # (before the alignment hints the report described plain, unpipelined loads)
    assert rows[0]["async_copies"] > 0 and rows[1]["tma_copies"] > 0 and rows[1]["async_copies"] == 0, rows
    assert "window_static  sm_90a  head dim 64" in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_window_attention_never_makes_the_host_wait_for_the_gpu() -> None:
    """Forward and backward of the window kernel return with earlier GPU work still queued."""
    q, k, v = (torch.randn(1, 4, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))

    def step() -> None:
        attention(q, k, v, SlidingWindow(256), backend="triton_window").sum().backward()

    assert returns_while_the_gpu_is_busy(step)  # after two warm-up calls (the second accumulates)
    assert torch.isfinite(q.grad).all()
