"""Where one forward+backward of the sliding-window kernel spends its time, GPU and host.

Three views, each of the same ``attention(..., backend="triton_window")`` call:
  * the GPU kernels of one forward+backward (torch.profiler), their times and their share;
  * the host's cost of each step of the call path, timed alone (launches issued back to back,
    fewer than the launch queue holds, so the host and not the GPU sets the pace);
  * the same pieces alone: the autograd engine around trivial Functions (and on the calling
    thread), Triton launches of empty kernels with few and many arguments and descriptors, the
    forward kernel launched through its compiled handle;
  * a cProfile of many calls, the functions with most time of their own;
  * with --sample, where each thread's stack was while the calls ran (the autograd thread too).

  python3 benchmarks/diagnostics/window_profile.py --seq 8192 32768
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from typing import Callable

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(_HERE)), os.path.dirname(_HERE), _HERE]  # repo, benchmarks/, here

import torch  # noqa: E402

from attn_bench import QUEUED_MS, time_ms  # noqa: E402
from host_sampler import sample  # noqa: E402
from window_host_overhead import host_us  # noqa: E402

from kernels.attention import attention  # noqa: E402
from kernels.attention import masks as M  # noqa: E402
from kernels.attention import window_triton as wt  # noqa: E402


def kernel_table(fn: Callable[[], object], iters: int = 3) -> list[tuple[str, int, float]]:
    """``(kernel name, launches per call, GPU us per call)`` of ``fn``, longest first."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "self_device_time_total", None)
        if dev_us is None:
            dev_us = e.self_cuda_time_total
        if dev_us > 0 and e.device_type == torch.autograd.DeviceType.CUDA:
            rows.append((e.key, e.count // iters, dev_us / iters))
    return sorted(rows, key=lambda r: -r[2])


class _Twice(torch.autograd.Function):
    """A custom Function of one torch op each way: the autograd engine's own cost per call."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x * 2

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return g * 2


class _NoKernels(torch.autograd.Function):
    """The window Function's inputs and outputs, no kernel either way: autograd plus allocation."""

    @staticmethod
    def forward(ctx, q, k, v):  # type: ignore[override]
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q), torch.empty(q.shape[:3], device=q.device)

    @staticmethod
    def backward(ctx, do, _dlse):  # type: ignore[override]
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


if wt.triton is not None:
    tl = wt.tl

    @wt.triton.jit
    def _nop1(X):
        pass

    @wt.triton.jit
    def _nop30(X, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20,
               a21, a22, a23, a24, a25, a26, a27, a28, a29, B: tl.constexpr):
        pass

    @wt.triton.jit
    def _nop_desc(D1, D2, D3, D4, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17,
                  a18, a19, a20, a21, a22, a23, a24, a25, a26, B: tl.constexpr):
        pass


class _LaunchesInBackward(torch.autograd.Function):
    """One torch op forward; a backward that launches an empty Triton kernel ``n`` times."""

    @staticmethod
    def forward(ctx, x, n):  # type: ignore[override]
        ctx.n = n
        return x * 2

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        ints = list(range(1, 30))
        for _ in range(ctx.n):
            _nop30[(1,)](g, *ints, B=16)
        return g * 2, None


def timed_parts(fb: Callable[[], object], calls: int = 30) -> dict[str, float]:
    """Host microseconds per call spent inside each backward launcher (wherever autograd runs it)."""
    spent: dict[str, float] = {}
    originals = {name: getattr(wt, name) for name in ("launch_delta", "launch_dkdv", "launch_dq_from_ds", "launch_dq",
                                                      "backward")}

    def wrap(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def timed(*a: object, **kw: object) -> object:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return timed

    for name, fn in originals.items():
        setattr(wt, name, wrap(name, fn))
    try:
        fb()
        torch.cuda.synchronize()
        spent.clear()
        for _ in range(calls):
            fb()
        torch.cuda.synchronize()
    finally:
        for name, fn in originals.items():
            setattr(wt, name, fn)
    return {name: t / calls * 1e6 for name, t in spent.items()}


def variants(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, mask: M.Mask,
             cfg: wt.WindowConfig, window: int) -> dict[str, float]:
    """Host microseconds per call of the pieces a forward+backward is made of, each alone."""
    fb = lambda: torch.autograd.grad(attention(q, k, v, mask, backend="triton_window"), (q, k, v), g)  # noqa: E731
    out: dict[str, float] = {"window f+b": host_us(fb, 30)}
    torch.autograd.set_multithreading_enabled(False)
    try:
        out["window f+b, autograd on the calling thread"] = host_us(fb, 30)
    finally:
        torch.autograd.set_multithreading_enabled(True)
    for threaded in (True, False):
        torch.autograd.set_multithreading_enabled(threaded)
        where = "autograd thread" if threaded else "calling thread"
        try:
            for name, us in timed_parts(fb).items():
                out[f"  in {name}, on the {where}"] = us
            for n in (0, 10):
                out[f"backward launching {n} empty kernels, {where}"] = host_us(
                    lambda n=n: torch.autograd.grad(_LaunchesInBackward.apply(q, n), (q,), g))
        finally:
            torch.autograd.set_multithreading_enabled(True)
    out["Function of one torch op, f+b"] = host_us(lambda: torch.autograd.grad(_Twice.apply(q), (q,), g))
    out["window's Function shape, no kernels, f+b"] = host_us(
        lambda: torch.autograd.grad(_NoKernels.apply(q, k, v)[0], (q, k, v), g))
    x = torch.empty(16, device="cuda")
    ints = list(range(1, 30))
    out["triton launch, 1 arg"] = host_us(lambda: _nop1[(1,)](x), 200)
    out["triton launch, 30 args"] = host_us(lambda: _nop30[(1,)](x, *ints, B=16), 200)
    descs = [wt._operand(t, 64, True) for t in (q.detach(), k.detach(), v.detach(), g)]
    out["triton launch, 4 descriptors + 26 args"] = host_us(lambda: _nop_desc[(1,)](*descs, *ints[:26], B=16), 200)
    out["triton launch, 4 descriptors made per call"] = host_us(
        lambda: _nop_desc[(1,)](*(wt._operand(t, 64, True) for t in (q.detach(), k.detach(), v.detach(), g)),
                                *ints[:26], B=16), 200)
    # the forward kernel launched through its compiled handle, past JITFunction.run's binding
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    o = torch.empty_like(qd)
    lse2 = torch.empty(qd.shape[:3], device=qd.device)
    bm, bn, tma = cfg.fwd.block_m, cfg.fwd.block_n, cfg.fwd.tma
    s, hq, hkv = qd.shape[2], qd.shape[1], kd.shape[1]
    args = [wt._operand(qd, bm, tma), wt._operand(kd, bn, tma), wt._operand(vd, bn, tma), o, lse2, 0.1, s, window,
            hq // hkv, hq, hkv, *wt._qkv_strides(qd, kd, vd, o)]
    consts = dict(D=qd.shape[-1], BLOCK_M=bm, BLOCK_N=bn, TMA=tma)
    grid = (wt.triton.cdiv(s, bm), qd.shape[0] * hq)
    compiled = wt._fwd[grid](*args, **consts, num_warps=cfg.fwd.warps, num_stages=cfg.fwd.stages)
    out["forward kernel, JITFunction launch"] = host_us(
        lambda: wt._fwd[grid](*args, **consts, num_warps=cfg.fwd.warps, num_stages=cfg.fwd.stages))
    stream = torch.cuda.current_stream().cuda_stream
    every = [*args, *consts.values()]
    out["forward kernel, compiled handle launch"] = host_us(
        lambda: compiled.run(grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata, None, None,
                             None, *every))
    return out


def per_call_us(fn: Callable[[], object], calls: int = 200) -> dict[str, float]:
    """Host time of each call issued back to back (GPU drained before and after), with garbage
    collections counted: the mean, median, 90th percentile and worst call."""
    import gc

    collections = [0]
    counter = lambda phase, info: collections.__setitem__(0, collections[0] + (phase == "start"))  # noqa: E731
    fn()
    torch.cuda.synchronize()
    gc.callbacks.append(counter)
    times = []
    try:
        for _ in range(calls):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e6)
    finally:
        gc.callbacks.remove(counter)
    torch.cuda.synchronize()
    times.sort()
    return {"mean": sum(times) / calls, "p50": times[calls // 2], "p90": times[calls * 9 // 10], "max": times[-1],
            "gc": collections[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--cprofile-calls", type=int, default=40)
    ap.add_argument("--sample", action="store_true",
                    help="also sample every thread's stack during forward+backward calls (host_sampler.py)")
    ap.add_argument("--distribution", action="store_true",
                    help="also each forward+backward call's host time (mean, median, tail) with the garbage "
                         "collector on and off")
    ap.add_argument("--variants", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the pieces alone: autograd with trivial Functions, Triton launches of empty "
                         "kernels, the forward kernel launched through its compiled handle")
    args = ap.parse_args()
    hkv = args.kv_heads or args.heads
    cfg = wt.window_config(torch.device("cuda"), args.dim)
    mask = M.SlidingWindow(args.window)
    summary = []
    for s in args.seq:
        q = torch.randn(1, args.heads, s, args.dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(1, hkv, s, args.dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
        g = torch.randn_like(q)
        fwd = lambda: attention(q, k, v, mask, backend="triton_window")  # noqa: E731
        fb = lambda: torch.autograd.grad(fwd(), (q, k, v), g)  # noqa: E731
        print(f"\n=== S={s} H={args.heads}/{hkv} D={args.dim} window {args.window}  config {cfg}")
        table = kernel_table(fb)
        total = sum(r[2] for r in table)
        print(f"{'kernel':<60} {'per call':>8} {'GPU us':>9} {'share':>6}")
        for name, n, us in table:
            print(f"{name[:60]:<60} {n:>8} {us:>9.1f} {us / total:>6.1%}")
        print(f"{'sum':<60} {'':>8} {total:>9.1f}")

        with torch.no_grad():
            qd, kd, vd = q.detach(), k.detach(), v.detach()
            o, lse2 = wt.launch_forward(qd, kd, vd, args.window, 0.1, cfg.fwd)
            do = g.contiguous()
            delta = wt.launch_delta(o, do, cfg.dq)
            _, _, ds = wt.launch_dkdv(qd, kd, vd, do, lse2, delta, args.window, 0.1, cfg.dkdv,
                                      store_ds=cfg.dq_from_ds is not None, transposed=cfg.dkdv_transposed)
            steps: dict[str, Callable[[], object]] = {
                "TensorDescriptor.from_tensor": lambda: wt._operand(qd, 64, True),
                "window_config": lambda: wt.window_config(qd.device, args.dim),
                "ds_layout": lambda: wt.ds_layout(s, args.window, cfg.dkdv),
                "torch.empty_like(q)": lambda: torch.empty_like(qd),
                "launch_forward": lambda: wt.launch_forward(qd, kd, vd, args.window, 0.1, cfg.fwd),
                "launch_delta": lambda: wt.launch_delta(o, do, cfg.dq),
                "launch_dkdv": lambda: wt.launch_dkdv(qd, kd, vd, do, lse2, delta, args.window, 0.1, cfg.dkdv,
                                                      store_ds=ds is not None, transposed=cfg.dkdv_transposed),
                "backward() (no autograd)": lambda: wt.backward(qd, kd, vd, o, lse2, do, args.window, 0.1, cfg),
            }
            if ds is not None and cfg.dq_from_ds is not None:
                dqds = cfg.dq_from_ds
                steps["launch_dq_from_ds"] = lambda: wt.launch_dq_from_ds(qd, kd, ds, args.window, 0.1, cfg.dkdv,
                                                                          dqds.warps, dqds.stages, dqds.tma,
                                                                          transposed=cfg.dkdv_transposed)
            else:
                steps["launch_dq"] = lambda: wt.launch_dq(qd, kd, vd, do, lse2, delta, args.window, 0.1, cfg.dq)
            host = {name: host_us(fn) for name, fn in steps.items()}
        host["attention() forward"] = host_us(fwd)
        # the same forward queued, as the kernel alone and through attention(), alternating
        queued: dict[str, list[float]] = {"kernel": [], "attention()": []}
        for _ in range(3):
            queued["kernel"].append(time_ms(lambda: wt.launch_forward(q.detach(), k.detach(), v.detach(), args.window,
                                                                      0.1, cfg.fwd), queued_ms=QUEUED_MS))
            queued["attention()"].append(time_ms(fwd, queued_ms=QUEUED_MS))
        print("forward queued ms, kernel alone vs attention(), three alternations:",
              {name: [round(t, 3) for t in ts] for name, ts in queued.items()})
        host["forward+backward (autograd.grad)"] = host_us(fb, 30)
        print(f"\n{'host step':<40} {'us per call':>11}")
        for name, us in host.items():
            print(f"{name:<40} {us:>11.1f}")

        if args.sample:
            print(f"\nhost stacks sampled over 200 forward+backward calls (S={s}):")
            print(sample(fb, calls=200).table(top=20))
        if args.distribution:
            import gc

            print(f"\n{'f+b host us per call':<28} {'mean':>7} {'p50':>7} {'p90':>7} {'max':>8} {'collections':>11}")
            for label, disable in (("gc on", False), ("gc off", True)):
                if disable:
                    gc.disable()
                try:
                    for _ in range(2):
                        d = per_call_us(fb, 100)
                        print(f"{label:<28} {d['mean']:>7.0f} {d['p50']:>7.0f} {d['p90']:>7.0f} {d['max']:>8.0f} "
                              f"{d['gc']:>11}")
                finally:
                    gc.enable()
        if args.variants:
            print(f"\n{'variant':<48} {'host us':>8}")
            for name, us in variants(q, k, v, g, mask, cfg, args.window).items():
                print(f"{name:<48} {us:>8.1f}")
        if s == args.seq[0]:
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            prof.enable()
            for _ in range(args.cprofile_calls):
                fb()
            prof.disable()
            torch.cuda.synchronize()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
            print(f"\ncProfile, {args.cprofile_calls} forward+backward calls, by own time:")
            print("\n".join(buf.getvalue().splitlines()[:45]))
        summary.append((s, total, host["forward+backward (autograd.grad)"], host["attention() forward"]))

    print(f"\nwindow_profile  {torch.cuda.get_device_name()}  H={args.heads}/{hkv} D={args.dim} window {args.window}")
    print(f"{'S':>7} {'GPU us f+b':>10} {'host us f+b':>11} {'host us fwd':>11}")
    for s, gpu, hfb, hf in summary:
        print(f"{s:>7} {gpu:>10.1f} {hfb:>11.1f} {hf:>11.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
