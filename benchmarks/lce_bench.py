"""Fused linear + cross-entropy: fwd+bwd time and peak memory, ours vs the anchors, one run.

    python3 benchmarks/lce_bench.py --device cpu   # N=4096 H=1024 V=32768 fp32
    python3 benchmarks/lce_bench.py --device cuda  # N=4096,16384 H=4096 V=128256 bf16

Peak memory is "above the inputs and their gradients": the allocator's (CUDA) or the
process's (CPU, resident set in a fresh subprocess per contender) peak during one fwd+bwd,
minus what was held before it, minus the bytes of the gradients it produced. Time is the
median of timed fwd+bwd steps after warm-up. TFLOP/s count 6*N*H*V (three matrix products).
Prints a table (ratios against our default variant) and writes JSON (``--json``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.lce import linear_cross_entropy  # noqa: E402

StepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------- contenders
def unfused(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """What a model does without fusion: full logits, float32 softmax."""
    return F.cross_entropy(F.linear(x, w).float(), t)


def ours(**kwargs) -> StepFn:
    return lambda x, w, t: linear_cross_entropy(x, w, t, **kwargs)


def torch_chunked(**kwargs) -> StepFn:
    from torch.nn import LinearCrossEntropyOptions

    options = LinearCrossEntropyOptions(**kwargs)
    return lambda x, w, t: F.linear_cross_entropy(x, w, t, options=options)


def liger() -> StepFn:
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    loss = LigerFusedLinearCrossEntropyLoss()
    return lambda x, w, t: loss(w, x, t)


def cut_cross_entropy() -> StepFn:
    from cut_cross_entropy import linear_cross_entropy as cce

    return lambda x, w, t: cce(x, w, t)


def compiled_unfused() -> StepFn:
    return torch.compile(unfused)


CPU_CONTENDERS: dict[str, Callable[[], StepFn]] = {
    "unfused eager": lambda: unfused,
    "torch 2.13 chunked (auto)": lambda: torch_chunked(),
    "torch 2.13 chunked (accurate, 512 rows)": lambda: torch_chunked(acc_policy="accurate", chunking_method=None, batch_chunk_size=512),
    "ours (chunked, default)": lambda: ours(implementation="chunked"),
    "ours (chunked, 1024 rows)": lambda: ours(implementation="chunked", chunk_size=1024),
}

GPU_CONTENDERS: dict[str, Callable[[], StepFn]] = {
    "unfused eager": lambda: unfused,
    "unfused torch.compile": compiled_unfused,
    "Liger fused": liger,
    "Cut Cross-Entropy": cut_cross_entropy,
    "ours (triton, fp32 dW accum)": lambda: ours(implementation="triton"),
    "ours (triton, bf16 dW accum)": lambda: ours(implementation="triton", accum_dtype=torch.bfloat16),
    "ours (chunked torch ops)": lambda: ours(implementation="chunked", accum_dtype=torch.bfloat16),
    # the custom operator Inductor records (one pass over the gradients scales them in place)
    "ours under torch.compile (triton, bf16 dW accum)": lambda: torch.compile(
        ours(implementation="triton", accum_dtype=torch.bfloat16), fullgraph=True),
}


#: profiled on request (``--profile --only ...``), not in the anchor table: the route the
#: class-major layout replaced at N=4096 (one chunk of every row there)
DIAGNOSTIC_CONTENDERS: dict[str, Callable[[], StepFn]] = {
    "ours (triton, 4096-row chunks)": lambda: ours(implementation="triton", chunk_size=4096),
}


# --------------------------------------------------------------------------- measuring
def make_inputs(n: int, h: int, v: int, dtype: torch.dtype, device: str, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(n, h, generator=g, device=device, dtype=torch.float32) * 0.5).to(dtype).requires_grad_()
    w = (torch.randn(v, h, generator=g, device=device, dtype=torch.float32) * h**-0.5).to(dtype).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g, device=device)
    t[::17] = -100
    return x, w, t


def step(fn: StepFn, x, w, t) -> float:
    x.grad = w.grad = None
    loss = fn(x, w, t)
    loss.backward()
    return float(loss.detach().float())


def time_cuda(fn: StepFn, x, w, t, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        x.grad = w.grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x, w, t).backward()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def round_robin_cuda(fns: dict[str, StepFn], x, w, t, reps: int) -> dict[str, list[float]]:
    """``reps`` rounds of one timed step of each contender, the starting one rotating every
    round, so that a machine's drift hits all alike; each contender's step times (ms)."""
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for i in range(len(names)):
            name = names[(rep + i) % len(names)]
            times[name] += time_cuda(fns[name], x, w, t, 1)
    return times


def peak_cuda(fn: StepFn, x, w, t) -> float:
    x.grad = w.grad = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(x, w, t).backward()
    torch.cuda.synchronize()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in (x, w) if p.grad is not None)
    return (torch.cuda.max_memory_allocated() - base - grads) / 2**20


def matmul_ceiling_tflops(reps: int = 20) -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return 2 * 8192**3 / (statistics.median(times) * 1e-3) / 1e12


def run_cuda(args) -> dict:
    """Every contender at each N; steps are timed round-robin (one step of each contender per
    round, the starting contender rotating), so none is always measured on a hotter GPU."""
    h, v = 4096, 128256
    ceiling = matmul_ceiling_tflops()
    print(f"bf16 matmul ceiling (8192^3, median of 20): {ceiling:.0f} TFLOP/s", flush=True)
    rows = []
    for n in args.n:
        x, w, t = make_inputs(n, h, v, torch.bfloat16, "cuda")
        ready: dict[str, tuple[StepFn, float, float]] = {}
        for name, make in GPU_CONTENDERS.items():
            if args.only and not any(o in name for o in args.only):
                continue
            try:
                fn = make()
                for _ in range(args.warmup):
                    loss = step(fn, x, w, t)
                torch.cuda.synchronize()
                ready[name] = (fn, loss, peak_cuda(fn, x, w, t))
            except Exception as exc:  # a contender that cannot run is reported, not fatal
                print(f"  {name} @N={n}: FAILED {type(exc).__name__}: {exc}", flush=True)
                rows.append({"n": n, "name": name, "error": f"{type(exc).__name__}: {exc}"})
            x.grad = w.grad = None
            torch.cuda.empty_cache()
        names = list(ready)
        times = round_robin_cuda({name: ready[name][0] for name in names}, x, w, t, args.reps)
        ref_loss = ready[names[0]][1] if names else None
        for name in names:
            _, loss, peak = ready[name]
            ms = statistics.median(times[name])
            tflops = 6 * n * h * v / (ms * 1e-3) / 1e12
            rows.append({
                "n": n, "h": h, "v": v, "name": name, "ms": ms, "ms_all": times[name], "peak_mib": peak,
                "tflops": tflops, "loss": loss, "loss_rel_diff_vs_unfused": abs(loss - ref_loss) / abs(ref_loss),
            })
            print(f"  N={n:6d} {name:32s} {ms:8.2f} ms {peak:10.1f} MiB {tflops:6.0f} TFLOP/s  loss={loss:.6f}", flush=True)
        del ready
        x.grad = w.grad = None
        torch.cuda.empty_cache()
    return {"ceiling_tflops": ceiling, "rows": rows, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "timing": "round-robin: one step of each contender per round, starting contender rotating"}


def _timed(fn: Callable[[], object]) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e)


def run_sweep(args) -> dict:
    """Our Triton route across chunk sizes, and one chunk's phases timed one by one."""
    from kernels.lce.config import LossConfig, reduction_coefficients
    from kernels.lce.triton_kernels import triton_row_pass, triton_scale_

    h, v = 4096, 128256
    rows = []
    for n in args.n:
        x, w, t = make_inputs(n, h, v, torch.bfloat16, "cuda")
        for acc in args.accum:
            for chunk in args.chunks:
                fn = ours(implementation="triton", accum_dtype=acc, chunk_size=chunk)
                step(fn, x, w, t)
                peak = peak_cuda(fn, x, w, t)
                ms = statistics.median(time_cuda(fn, x, w, t, args.reps))
                rows.append({"n": n, "chunk": chunk, "accum": str(acc), "ms": ms, "peak_mib": peak})
                print(f"  sweep N={n} chunk={chunk:5d} accum={str(acc):15s} {ms:8.2f} ms {peak:8.1f} MiB "
                      f"{6 * n * h * v / ms / 1e9:5.0f} TFLOP/s", flush=True)
                x.grad = w.grad = None
                torch.cuda.empty_cache()
        del x, w, t
    x, w, t = make_inputs(max(args.chunks), h, v, torch.bfloat16, "cuda")
    x, w = x.detach(), w.detach()
    cfg = LossConfig()
    for chunk in args.chunks:
        xc, tc = x[:chunk], t[:chunk]
        coefs = reduction_coefficients(cfg, tc, None, v, torch.float32)
        buf = torch.empty(chunk, v, dtype=torch.bfloat16, device="cuda")
        dx = torch.empty_like(xc)
        dw16 = torch.empty_like(w)
        dw32 = torch.zeros(w.shape, dtype=torch.float32, device="cuda")
        one, half = torch.ones((), device="cuda"), torch.full((), 0.5, device="cuda")
        phases = {
            "logits mm": lambda: torch.mm(xc, w.t(), out=buf),
            "row kernel": lambda: triton_row_pass(buf, tc, cfg, None, coefs, None, True),
            **{
                f"row kernel b{blk} w{wrp}": (lambda blk=blk, wrp=wrp: triton_row_pass(
                    buf, tc, cfg, None, coefs, None, True, block=blk, num_warps=wrp))
                for blk, wrp in ((2048, 4), (4096, 8), (4096, 16), (8192, 8), (8192, 32), (16384, 32))
            },
            "dX mm": lambda: torch.mm(buf, w, out=dx),
            "dW addmm bf16": lambda: dw16.addmm_(buf.t(), xc),
            "dW addmm bf16, out^T": lambda: dw16.t().addmm_(xc.t(), buf),
            "dW mm bf16 (beta 0)": lambda: torch.mm(buf.t(), xc, out=dw16),
            "scale dW: mul_": lambda: dw16.mul_(one.to(dw16.dtype)),
            "scale dW: kernel, 1": lambda: triton_scale_(dw16, one),
            "scale dW: kernel, 0.5": lambda: triton_scale_(dw16, half),
        }
        try:
            torch.addmm(dw32, buf.t(), xc, out_dtype=torch.float32, out=dw32)
            phases["dW addmm fp32 out"] = lambda: torch.addmm(dw32, buf.t(), xc, out_dtype=torch.float32, out=dw32)
        except (RuntimeError, TypeError) as exc:
            print(f"  mixed addmm unavailable: {exc}")
        for name, fn in phases.items():
            fn()
            torch.cuda.synchronize()
            ms = statistics.median(_timed(fn) for _ in range(max(5, args.reps)))
            rows.append({"chunk": chunk, "phase": name, "ms": ms})
            if name.startswith("row kernel"):
                rate = f" {3 * chunk * v * 2 / ms / 1e6:6.0f} GB/s (3 passes)"
            elif name.startswith("scale"):
                rate = f" {2 * w.numel() * 2 / ms / 1e6:6.0f} GB/s (if read and written)"
            else:
                rate = f" {2 * chunk * h * v / ms / 1e9:5.0f} TFLOP/s"
            print(f"  phase chunk={chunk:5d} {name:22s} {ms:7.3f} ms{rate}", flush=True)
    return {"rows": rows}


def run_class_major_sweep(args) -> dict:
    """The class-major layout (logits inside the weight gradient's buffer): its phases, the
    column pass over tile shapes and programs per SM, dW over slab sizes, and the whole call
    per slab size against the same call in row chunks, all at H=4096, V=128256, bf16."""
    from kernels.lce import class_major, column_kernels
    from kernels.lce.config import LossConfig, reduction_coefficients

    h, v = 4096, 128256
    rows: list[dict] = []

    def report(name: str, ms: float, note: str = "") -> None:
        rows.append({"n": n, "phase": name, "ms": ms})
        print(f"  class-major N={n} {name:34s} {ms:8.3f} ms {note}", flush=True)

    for n in args.n:
        x, w, t = make_inputs(n, h, v, torch.bfloat16, "cuda")
        xd, wd = x.detach(), w.detach()
        cfg = LossConfig()
        coefs = reduction_coefficients(cfg, t, None, v, torch.float32)
        logits_t = torch.empty(v, n, dtype=torch.bfloat16, device="cuda")
        dw = torch.empty_like(wd)
        reps = max(5, args.reps)

        def phase(name: str, fn: Callable[[], object], note: Callable[[float], str] = lambda ms: "") -> None:
            fn()
            torch.cuda.synchronize()
            ms = statistics.median(_timed(fn) for _ in range(reps))
            report(name, ms, note(ms))

        flops = lambda ms: f"{2 * n * h * v / ms / 1e9:5.0f} TFLOP/s"  # noqa: E731
        gbs = lambda ms: f"{3 * n * v * 2 / ms / 1e6:6.0f} GB/s (3 passes)"  # noqa: E731
        phase("logits^T = W x^T", lambda: torch.mm(wd, xd.t(), out=logits_t), flops)
        phase("dX = dlogits W", lambda: torch.mm(logits_t.t(), wd), flops)
        for slab in (1024, 2048, 4096, 8192):
            def slabs(slab=slab):
                for first in range(0, v, slab):
                    torch.mm(logits_t[first:first + slab], xd, out=dw[first:first + slab])
            phase(f"dW in {slab}-class slabs", slabs, flops)
        phase("dW one product (reference)", lambda: torch.mm(logits_t, xd, out=dw), flops)
        # the same products in the row layout (one chunk of every row), and per slab of classes
        # held token-major (slab s: an N x slab block of its own), for comparison in one run
        logits = logits_t.view(n, v)
        phase("rows: logits = x W^T", lambda: torch.mm(xd, wd.t(), out=logits), flops)
        phase("rows: dX = dlogits W", lambda: torch.mm(logits, wd), flops)
        phase("rows: dW = dlogits^T x", lambda: torch.mm(logits.t(), xd, out=dw), flops)
        from kernels.lce.triton_kernels import triton_row_pass
        phase("rows: row kernel", lambda: triton_row_pass(logits, t, cfg, None, coefs, None, True), gbs)
        slab = 8192
        blocks = [logits_t.view(-1)[first * n: min(first + slab, v) * n].view(n, -1) for first in range(0, v, slab)]
        dx32 = torch.empty(n, h, dtype=torch.float32, device="cuda")

        def slab_logits():
            for i, first in enumerate(range(0, v, slab)):
                torch.mm(xd, wd[first:first + slab].t(), out=blocks[i])

        def slab_dw():
            for i, first in enumerate(range(0, v, slab)):
                torch.mm(blocks[i].t(), xd, out=dw[first:first + slab])

        def slab_dx():
            for i, first in enumerate(range(0, v, slab)):
                torch.addmm(dx32, blocks[i], wd[first:first + slab], beta=0.0 if i == 0 else 1.0,
                            out_dtype=torch.float32, out=dx32)
        phase("token-major slabs: logits", slab_logits, flops)
        phase("token-major slabs: dW", slab_dw, flops)
        try:
            phase("token-major slabs: dX into fp32", slab_dx, flops)
        except (RuntimeError, TypeError) as exc:
            print(f"  mixed addmm unavailable: {exc}")
        del blocks, dx32, logits
        loss_gbs = lambda ms: f"{n * v * 2 / ms / 1e6:6.0f} GB/s (1 pass)"  # noqa: E731
        tiles_of = column_kernels.ColumnTiles
        grad_default = column_kernels.GRAD_TILES
        for shape in ((64, 16, 4), (64, 32, 4), (128, 16, 8), (32, 32, 4), (64, 8, 4)):
            for per_sm in (16, 32, 64):  # the statistics pass alone (loss only)
                tiles = (tiles_of(*shape, per_sm), grad_default)
                phase(f"column stats {shape[0]}x{shape[1]}/w{shape[2]} {per_sm}/SM",
                      lambda tiles=tiles: column_kernels.triton_column_pass(
                          logits_t, t, cfg, None, coefs, None, False, tiles=tiles), loss_gbs)
        stats_default = column_kernels.STATS_TILES
        for shape in ((128, 32, 8), (64, 32, 4), (128, 64, 8), (128, 16, 8), (256, 16, 8)):
            for per_sm in (8, 16, 32):  # both passes, the statistics at its default shape
                tiles = (stats_default, tiles_of(*shape, per_sm))
                phase(f"column both, grad {shape[0]}x{shape[1]}/w{shape[2]} {per_sm}/SM",
                      lambda tiles=tiles: column_kernels.triton_column_pass(
                          logits_t, t, cfg, None, coefs, None, True, tiles=tiles), gbs)
        del logits_t, dw
        torch.cuda.empty_cache()
        default_slabs = class_major.SLAB_ROWS
        for slab in (2048, 4096, 8192):
            class_major.SLAB_ROWS = (slab,)
            fn = ours(implementation="triton")
            step(fn, x, w, t)
            held = w.grad.untyped_storage().nbytes() > w.grad.numel() * 2
            peak = peak_cuda(fn, x, w, t)
            ms = statistics.median(time_cuda(fn, x, w, t, args.reps))
            report(f"whole call, {slab}-class slabs", ms, f"{peak:7.1f} MiB" + ("" if held else " (row chunks)"))
        class_major.SLAB_ROWS = default_slabs
        fn = ours(implementation="triton", chunk_size=n)
        step(fn, x, w, t)
        peak = peak_cuda(fn, x, w, t)
        report("whole call, one row chunk", statistics.median(time_cuda(fn, x, w, t, args.reps)), f"{peak:7.1f} MiB")
        x.grad = w.grad = None
        del x, w, t
        torch.cuda.empty_cache()
    return {"rows": rows}


def idle_gaps(events) -> list[dict]:
    """The GPU's idle intervals between consecutive kernels of a profile, longest first, with
    the kernels on either side (where a call makes the device wait on the host)."""
    kernels = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    gaps = []
    for before, after in zip(kernels, kernels[1:]):
        idle = after.time_range.start - max(before.time_range.end, 0)
        if idle > 0:
            gaps.append({"us": idle, "after": before.name, "before": after.name})
    return sorted(gaps, key=lambda g: -g["us"])


def run_profile(args) -> dict:
    """Where one fwd+bwd spends its GPU time: per-kernel totals from torch.profiler, and the
    GPU-busy time against the step's wall time (gaps = the GPU waiting on the host)."""
    from torch.profiler import ProfilerActivity, profile

    h, v = 4096, 128256
    result = []
    for n in args.n:
        x, w, t = make_inputs(n, h, v, torch.bfloat16, "cuda")
        for name, make in {**GPU_CONTENDERS, **DIAGNOSTIC_CONTENDERS}.items():
            if not any(o in name for o in args.only or []) and (args.only or name in DIAGNOSTIC_CONTENDERS):
                continue
            fn = make()
            for _ in range(max(2, args.warmup)):
                step(fn, x, w, t)
            torch.cuda.synchronize()
            steps = 2
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                t0 = time.perf_counter()
                for _ in range(steps):
                    x.grad = w.grad = None
                    fn(x, w, t).backward()
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t0) * 1e3 / steps
            kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
            busy = sum(e.self_device_time_total for e in kernels) / 1e3 / steps
            top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:10]
            print(f"  profile N={n} {name}: wall {wall:.2f} ms/step (profiled), GPU busy {busy:.2f} ms/step", flush=True)
            for e in top:
                print(f"    {e.self_device_time_total / 1e3 / steps:8.3f} ms  x{e.count // steps:<4d} {e.key[:90]}", flush=True)
            gaps = idle_gaps(prof.events())
            for gap in gaps[:6]:
                print(f"    idle {gap['us']:8.1f} us  after {gap['after'][:50]}  before {gap['before'][:50]}", flush=True)
            result.append({"n": n, "name": name, "wall_ms": wall, "busy_ms": busy, "gaps": gaps[:20],
                           "top": [{"kernel": e.key, "ms": e.self_device_time_total / 1e3 / steps,
                                    "count": e.count // steps} for e in top]})
            del fn
            x.grad = w.grad = None
            torch.cuda.empty_cache()
    return {"profile": result}


# --------------------------------------------------------------------------- CPU
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cpu_worker(name: str, n: int, h: int, v: int) -> dict:
    """Peak resident memory of one contender's first fwd+bwd, in this (fresh) process."""
    torch.manual_seed(0)
    x, w, t = make_inputs(n, h, v, torch.float32, "cpu")
    fn = CPU_CONTENDERS[name]()
    base = _rss_bytes()
    loss = step(fn, x, w, t)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    grads = sum(p.grad.numel() * p.grad.element_size() for p in (x, w))
    return {"name": name, "peak_mib": (peak - base - grads) / 2**20, "loss": loss}


def run_cpu(args) -> dict:
    """Memory: one fresh process per contender. Time: all contenders in one process,
    round-robin (one step of each per round), so that a loaded machine's drift hits all alike."""
    n, h, v = 4096, 1024, 32768
    names = [name for name in CPU_CONTENDERS if not args.only or any(o in name for o in args.only)]
    rows = {}
    for name in names:
        out = subprocess.run([sys.executable, __file__, "--cpu-worker", name], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(f"  {name}: FAILED\n{out.stderr[-2000:]}", flush=True)
            continue
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1]) | {"n": n, "h": h, "v": v, "ms_all": []}
        print(f"  memory {name:45s} {rows[name]['peak_mib']:9.1f} MiB  loss={rows[name]['loss']:.6f}", flush=True)
    x, w, t = make_inputs(n, h, v, torch.float32, "cpu")
    fns = {name: CPU_CONTENDERS[name]() for name in rows}
    for round_ in range(args.reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            step(fn, x, w, t)
            rows[name]["ms_all"].append((time.perf_counter() - t0) * 1e3)
            print(f"  round {round_} {name:45s} {rows[name]['ms_all'][-1]:9.1f} ms", flush=True)
    for row in rows.values():
        row["ms"] = statistics.median(row["ms_all"])
    return {"rows": list(rows.values()), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(), "load_avg_at_end": os.getloadavg()}


# --------------------------------------------------------------------------- report
def print_table(result: dict, anchor: str) -> None:
    rows = [r for r in result["rows"] if "error" not in r]
    print()
    ceiling = result.get("ceiling_tflops")
    for n in sorted({r["n"] for r in rows}):
        group = [r for r in rows if r["n"] == n]
        base = next((r for r in group if r["name"] == anchor), None)
        print(f"N={n}" + (f"  (bf16 matmul ceiling {ceiling:.0f} TFLOP/s, floor {6 * n * 4096 * 128256 / ceiling / 1e9:.1f} ms)" if ceiling else ""))
        head = f"| {'implementation':45s} | {'fwd+bwd ms':>10s} | {'peak MiB':>9s} | {'ours/this time':>14s} | {'ours/this mem':>13s} |"
        if ceiling:
            head += " TFLOP/s | % ceiling |"
        print(head)
        for r in group:
            t_ratio = base["ms"] / r["ms"] if base else float("nan")
            m_ratio = base["peak_mib"] / r["peak_mib"] if base and r["peak_mib"] > 0 else float("nan")
            line = f"| {r['name']:45s} | {r['ms']:10.2f} | {r['peak_mib']:9.1f} | {t_ratio:14.2f} | {m_ratio:13.3f} |"
            if ceiling:
                line += f" {r['tflops']:7.0f} | {100 * r['tflops'] / ceiling:8.1f}% |"
            print(line)
        print()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n", type=int, nargs="+", default=[4096, 16384], help="token counts (CUDA)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--only", nargs="*", help="substrings of contender names to run")
    p.add_argument("--json", type=Path, help="where to write the results")
    p.add_argument("--sweep", action="store_true", help="CUDA: our route over --chunks, and per-phase times")
    p.add_argument("--chunks", type=int, nargs="+", default=[512, 896, 1024, 2048])
    p.add_argument("--accum", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"],
                   help="--sweep: dW accumulator dtypes")
    p.add_argument("--class-major", action="store_true",
                   help="CUDA: the class-major layout's phases, tiles and slab sizes at --n")
    p.add_argument("--profile", action="store_true", help="CUDA: per-kernel GPU time of one fwd+bwd per contender")
    p.add_argument("--cpu-worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.accum = [getattr(torch, a) for a in args.accum]
    if args.cpu_worker:
        print(json.dumps(cpu_worker(args.cpu_worker, 4096, 1024, 32768)))
        return
    if args.sweep or args.profile or args.class_major:
        result = run_sweep(args) if args.sweep else run_class_major_sweep(args) if args.class_major else run_profile(args)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return
    result = run_cuda(args) if args.device == "cuda" else run_cpu(args)
    result.update(date=datetime.now(timezone.utc).isoformat(timespec="seconds"), argv=sys.argv, host=platform.node())
    anchor = "ours (triton, fp32 dW accum)" if args.device == "cuda" else "ours (chunked, default)"
    print_table(result, anchor)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
