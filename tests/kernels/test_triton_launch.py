"""The direct-launch cache in front of Triton kernels (``kernels/triton_launch.py``): its key
tells apart everything Triton specializes on, a hit passes the compiled handle the arguments
in the kernel's order, and on a GPU the direct launches compute what Triton's own launch does."""
from __future__ import annotations

import types

import pytest
import torch

import kernels.triton_launch as tlaunch
from tests.helpers.triton_interpreter import HAS_TRITON


def test_specialization_key_separates_what_triton_specializes_on() -> None:
    key = tlaunch.specialization_key
    base = torch.zeros(64)
    assert key(base) == key(torch.zeros(64))
    assert key(base) != key(base[1:])  # 4-byte offset: no longer 16-byte aligned
    assert key(base) != key(base.double())
    assert key(16) != key(17) and key(1) != key(True) and key(1) != key(2)
    assert key(0.1) == key(0.7)  # floats are fp32 arguments, never specialized on
    assert key(None) == key(None)


class _Handle:
    def __init__(self) -> None:
        self.function, self.packed_metadata, self.calls = object(), object(), []

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, *args):
        self.calls.append(args)


class _Kernel:
    """Stands in for a JITFunction: ``kernel[grid](...)`` compiles (counted) and returns a handle."""

    arg_names = ["X", "n", "BLOCK"]

    def __init__(self) -> None:
        self.compiles: list[tuple] = []
        self.handles: list[_Handle] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.compiles.append((grid, args, kwargs))
            self.handles.append(_Handle())
            return self.handles[-1]
        return launch


def test_launcher_reuses_a_handle_only_for_the_same_specialization(monkeypatch) -> None:
    monkeypatch.setattr(tlaunch, "direct_launch_supported", lambda: True)
    monkeypatch.setattr(tlaunch.torch.cuda, "current_device", lambda: 0)
    fake_triton = types.SimpleNamespace(runtime=types.SimpleNamespace(
        driver=types.SimpleNamespace(active=types.SimpleNamespace(get_current_stream=lambda dev: 1234))))
    monkeypatch.setattr(tlaunch, "triton", fake_triton)
    monkeypatch.setattr(tlaunch, "knobs", types.SimpleNamespace(runtime=types.SimpleNamespace(
        launch_enter_hook="enter", launch_exit_hook="exit")))
    kernel = _Kernel()
    launch = tlaunch.Launcher(kernel, max_entries=2)
    x = torch.zeros(64)
    launch((4,), x, 32, num_warps=4, num_stages=2, BLOCK=16)
    launch((8, 2), x, 32, num_warps=4, num_stages=2, BLOCK=16)  # same specialization, another grid
    assert len(kernel.compiles) == 1 and launch.direct_launches == 1
    (call,) = kernel.handles[0].calls
    assert call[:4] == (8, 2, 1, 1234) and call[4] is kernel.handles[0].function
    assert call[6:9] == (None, "enter", "exit") and call[9:] == (x, 32, 16)  # arguments in the kernel's order
    launch((4,), x, 33, num_warps=4, num_stages=2, BLOCK=16)  # another integer value
    launch((4,), x[1:], 32, num_warps=4, num_stages=2, BLOCK=16)  # misaligned
    launch((4,), x, 32, num_warps=8, num_stages=2, BLOCK=16)  # other launch options
    assert len(kernel.compiles) == 4 and launch.direct_launches == 1
    assert len(launch._handles) == 2  # the oldest entries were dropped
    for _ in range(2):  # an unhashable argument takes Triton's path, and is never cached
        launch((4,), x, 32, num_warps=4, num_stages=2, BLOCK=[16])
    assert len(kernel.compiles) == 6 and launch.direct_launches == 1


def test_launcher_takes_tritons_own_path_where_direct_launch_is_unsupported(monkeypatch) -> None:
    monkeypatch.setattr(tlaunch, "direct_launch_supported", lambda: False)
    kernel = _Kernel()
    launch = tlaunch.Launcher(kernel)
    for _ in range(3):
        launch((4,), torch.zeros(4), 32, num_warps=4, BLOCK=16)
    assert len(kernel.compiles) == 3 and launch.direct_launches == 0
    assert kernel.compiles[0][2] == {"BLOCK": 16, "num_warps": 4}  # num_stages left to Triton's default


def test_launcher_refuses_arguments_its_key_would_not_see(monkeypatch) -> None:
    monkeypatch.setattr(tlaunch, "direct_launch_supported", lambda: True)
    launch = tlaunch.Launcher(_Kernel())
    with pytest.raises(TypeError, match="takes 3 arguments"):
        launch((1,), torch.zeros(4), 32, num_warps=4, BLOCK=16, maxnreg=128)
    with pytest.raises(TypeError, match="takes 3 arguments"):
        launch((1,), torch.zeros(4), num_warps=4, BLOCK=16)


def test_interpreter_never_launches_directly(monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not tlaunch.direct_launch_supported()


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _scaled_copy(X, Y, n, scale, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * scale, mask=offs < n)


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs a CUDA GPU and triton")
def test_direct_launches_compute_what_tritons_launch_does_on_gpu() -> None:
    if not tlaunch.direct_launch_supported():
        pytest.skip(f"direct launches are written for Triton {tlaunch.DIRECT_LAUNCH_VERSIONS}")
    launch = tlaunch.Launcher(_scaled_copy)
    storage = torch.randn(4097, device="cuda")
    # aligned and 4 bytes off (vectorized and scalar loads), an integer divisible by 16 and not,
    # each twice: the second of each pair is a direct launch of the first one's kernel
    cases = [(storage[:4096], 4096), (storage[1:], 4096), (storage[:4096], 4000), (storage[1:4001], 4000)]
    for x, n in cases * 2:
        y = torch.full_like(x, float("nan"))
        launch((triton.cdiv(n, 256),), x, y, n, 0.5, num_warps=4, BLOCK=256)
        assert torch.equal(y[:n], x[:n] * 0.5)
    assert launch.direct_launches == len(cases) and len(launch._handles) == len(cases)


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs a CUDA GPU and triton")
def test_window_attention_launches_directly_after_its_first_call_on_gpu() -> None:
    import kernels.attention.window_triton as wt
    from kernels.attention import attention
    from kernels.attention.masks import SlidingWindow

    if not tlaunch.direct_launch_supported():
        pytest.skip(f"direct launches are written for Triton {tlaunch.DIRECT_LAUNCH_VERSIONS}")
    torch.manual_seed(2)
    storage = torch.randn(2 * 4 * 640 * 64 + 1, device="cuda", dtype=torch.bfloat16)
    aligned = storage[:-1].view(2, 4, 640, 64)
    misaligned = storage[1:].view(2, 4, 640, 64)  # copied to an aligned base before the kernels
    before = wt._LAUNCH["_fwd"].direct_launches
    outs = [attention(t, t, t, SlidingWindow(128), backend="triton_window") for t in (aligned, aligned, misaligned)]
    assert wt._LAUNCH["_fwd"].direct_launches == before + 2
    assert torch.equal(outs[0], outs[1])
    ref = attention(misaligned, misaligned, misaligned, SlidingWindow(128), backend="math")
    assert float((outs[2].float() - ref.float()).norm() / ref.float().norm()) <= 1e-2


def test_on_device_changes_nothing_for_cpu_tensors() -> None:
    import contextlib

    assert isinstance(tlaunch.on_device(torch.device("cpu")), contextlib.nullcontext)


two_gpus = pytest.mark.skipif(not HAS_TRITON or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs and triton")


@two_gpus
def test_window_attention_runs_on_its_tensors_gpu_not_the_current_one() -> None:
    from kernels.attention import attention
    from kernels.attention.masks import SlidingWindow

    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 4, 512, 64, device="cuda:1", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    with torch.cuda.device(0):
        out = attention(q, k, v, SlidingWindow(128), backend="triton_window")
        grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    ref = attention(q, k, v, SlidingWindow(128), backend="math")
    ref_grads = torch.autograd.grad(ref, (q, k, v), torch.ones_like(ref))
    for a, r in zip((out, *grads), (ref, *ref_grads)):
        assert a.device == torch.device("cuda:1")
        assert float((a.detach().float() - r.detach().float()).norm() / r.detach().float().norm()) <= 1e-2


@two_gpus
def test_fused_loss_runs_on_its_tensors_gpu_not_the_current_one() -> None:
    from kernels.lce import linear_cross_entropy

    torch.manual_seed(5)
    x = torch.randn(300, 64, device="cuda:1", requires_grad=True)
    w = torch.randn(1000, 64, device="cuda:1", requires_grad=True)
    t = torch.randint(0, 1000, (300,), device="cuda:1")
    with torch.cuda.device(0):
        loss = linear_cross_entropy(x, w, t, label_smoothing=0.1)
        gx, gw = torch.autograd.grad(loss, (x, w))
    ref = torch.nn.functional.cross_entropy(x @ w.T, t, label_smoothing=0.1)
    rx, rw = torch.autograd.grad(ref, (x, w))
    assert loss.device == torch.device("cuda:1")
    assert torch.allclose(loss, ref, rtol=1e-5, atol=1e-6)
    assert torch.allclose(gx, rx, rtol=1e-4, atol=1e-6) and torch.allclose(gw, rw, rtol=1e-4, atol=1e-6)
