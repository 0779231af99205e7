"""Where the window forward's call loses to its kernel: the kernel's own GPU time against the
time per call when calls are queued back to back, for the kernel launched directly and for the
whole ``attention()`` call (with and without autograd), in alternating rounds.

For each form, a queued region of calls is profiled (torch.profiler): the median duration of
the forward kernel, the median idle gap between one call's kernel and the next, and the region's
time per call from CUDA events (as ``attn_bench.py`` times "queued").

  python3 benchmarks/window_forward_gaps.py --seq 32768 --rounds 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from attn_bench import QUEUED_MS, time_ms  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
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
    print(f"\nwindow forward  S={args.seq}  {args.heads}x{args.dim}  window {args.window}  "
          f"medians over {args.rounds} rounds (us)")
    print("| form | kernel (profiler) | gap to the next call's kernel | queued per call | queued, profiler on |\n"
          "|---|---:|---:|---:|---:|")
    for name, rs in rows.items():
        med = [statistics.median(r[i] for r in rs) for i in range(4)]
        print(f"| {name} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | {med[3]:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
