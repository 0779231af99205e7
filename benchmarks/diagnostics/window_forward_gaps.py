"""Where the window forward's call loses to its kernel: the kernel's own GPU time against the
time per call when calls are queued back to back, for the kernel launched directly and for the
whole ``attention()`` call (with and without autograd), in alternating rounds.

For each form, a queued region of calls is profiled (torch.profiler): the median duration of
the forward kernel, the median idle gap between one call's kernel and the next, and the region's
time per call from CUDA events (as ``attn_bench.py`` times "queued").

With ``--bursts``, also the time per call of bursts of N queued calls after the GPU idled
for a moment (CUDA events), for the window kernel's and stock compiled flex's forward and
forward+backward through ``attention()``: whether a call gets slower the longer the GPU has
been busy (its clocks under sustained load), which the profiled 40-call windows would miss.

  python3 benchmarks/diagnostics/window_forward_gaps.py --seq 32768 --rounds 3
  python3 benchmarks/diagnostics/window_forward_gaps.py --seq 32768 --rounds 0 --bursts 5 20 80 320 1280
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(_HERE)), os.path.dirname(_HERE), _HERE]  # repo, benchmarks/, here

import torch  # noqa: E402

from attn_bench import QUEUED_MS, region_ms, time_ms  # noqa: E402

from kernels.attention import attention  # noqa: E402
from kernels.attention import masks as M  # noqa: E402
from kernels.attention import window_triton as wt  # noqa: E402


def kernel_spans(fn: Callable[[], object], calls: int) -> tuple[list[tuple[float, float]], int]:
    """``(start us, duration us)`` of the forward kernel in ``calls`` queued calls, in order, and
    how many other GPU kernels ran beside them."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    spans = [(e.time_range.start, e.time_range.elapsed_us()) for e in kernels if "_fwd" in e.name]
    return sorted(spans), len(kernels) - len(spans)


def summary(spans: list[tuple[float, float]]) -> tuple[float, float, int]:
    """(median kernel us, median gap us between consecutive kernels, kernels)."""
    durations = [d for _, d in spans]
    gaps = [b[0] - (a[0] + a[1]) for a, b in zip(spans, spans[1:])]
    return statistics.median(durations), (statistics.median(gaps) if gaps else 0.0), len(spans)


def burst_us(fn: Callable[[], object], calls: int, idle_s: float = 0.3) -> float:
    """Time per call (us, CUDA events) of ``calls`` queued calls after ``idle_s`` of idle GPU."""
    torch.cuda.synchronize()
    time.sleep(idle_s)
    return region_ms(fn, calls) * 1e3


def burst_table(args: argparse.Namespace, leaves: list[torch.Tensor], mask: M.Mask) -> None:
    """Time per call of bursts of each length, round-robin over the window kernel's and stock
    compiled flex's forward and forward+backward (each burst after an idle moment), beside
    ``attn_bench.py``'s queued timing of the same calls."""
    g = torch.randn_like(leaves[0])
    forms: dict[str, Callable[[], object]] = {}
    for backend in ("triton_window", "flex"):
        forms[f"{backend} fwd"] = lambda b=backend: attention(*leaves, mask, backend=b)
        forms[f"{backend} f+b"] = lambda b=backend: torch.autograd.grad(attention(*leaves, mask, backend=b), leaves, g)
    for fn in forms.values():  # compile and warm every form first
        for _ in range(3):
            fn()
    queued = {name: time_ms(fn, target_ms=150, queued_ms=QUEUED_MS) * 1e3 for name, fn in forms.items()}
    results: dict[tuple[str, int], list[float]] = {(name, n): [] for name in forms for n in args.bursts}
    for _ in range(3):
        for n in args.bursts:
            for name, fn in forms.items():
                results[(name, n)].append(burst_us(fn, n))
    print(f"\nbursts of queued calls after 0.3 s idle (us per call, median of 3 round-robin repeats); "
          f"'queued': attn_bench's timing\n| form | queued | " + " | ".join(f"{n} calls" for n in args.bursts)
          + " |\n|---|---:|" + "---:|" * len(args.bursts))
    for name in forms:
        print(f"| {name} | {queued[name]:.1f} | "
              + " | ".join(f"{statistics.median(results[(name, n)]):.1f}" for n in args.bursts) + " |")
    for kind in ("fwd", "f+b"):
        ratios = [statistics.median(results[(f"flex {kind}", n)]) / statistics.median(results[(f"triton_window {kind}", n)])
                  for n in args.bursts]
        print(f"| flex / window, {kind} | {queued[f'flex {kind}'] / queued[f'triton_window {kind}']:.2f}x | "
              + " | ".join(f"{r:.2f}x" for r in ratios) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bursts", type=int, nargs="*", default=[], help="burst lengths (calls) to time after idling")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("window_forward_gaps: needs a CUDA GPU", file=sys.stderr)
        return 2
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda: torch.randn(1, args.heads, args.seq, args.dim, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                             generator=g)
    q, k, v = mk(), mk(), mk()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    mask = M.sliding_window(args.window)
    cfg = wt.window_config(q.device, args.dim)
    scale = args.dim ** -0.5

    def no_grad_call():
        with torch.no_grad():
            return attention(q, k, v, mask, backend="triton_window")

    forms: dict[str, Callable[[], object]] = {
        "kernel (launch_forward)": lambda: wt.launch_forward(q, k, v, args.window, scale, cfg.fwd),
        "attention(), no grad": no_grad_call,
        "attention(), leaves need grad": lambda: attention(*leaves, mask, backend="triton_window"),
    }
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in forms}
    for rnd in range(args.rounds):
        names = list(forms) if rnd % 2 == 0 else list(forms)[::-1]
        for name in names:
            spans, others = kernel_spans(forms[name], args.calls)
            kernel_us, gap_us, _ = summary(spans)
            queued_ms = time_ms(forms[name], target_ms=150, queued_ms=QUEUED_MS)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
                profiled_ms = time_ms(forms[name], target_ms=150, queued_ms=QUEUED_MS)
            rows[name].append((kernel_us, gap_us, queued_ms * 1e3, profiled_ms * 1e3))
            print(f"[round {rnd}] {name}: kernel {kernel_us:.1f} us, gap {gap_us:.1f} us, "
                  f"queued {queued_ms * 1e3:.1f} us per call ({profiled_ms * 1e3:.1f} while profiled), "
                  f"{others} other kernels", flush=True)
    if args.rounds:
        print(f"\nwindow forward  S={args.seq}  {args.heads}x{args.dim}  window {args.window}  "
              f"medians over {args.rounds} rounds (us)")
        print("| form | kernel (profiler) | gap to the next call's kernel | queued per call | queued, profiler on |\n"
              "|---|---:|---:|---:|---:|")
        for name, rs in rows.items():
            med = [statistics.median(r[i] for r in rs) for i in range(4)]
            print(f"| {name} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | {med[3]:.1f} |")
    if args.bursts:
        burst_table(args, leaves, mask)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
