"""Host time per call of the sliding-window kernel's forward and forward+backward, TMA loads
against pointer loads, beside the queued GPU time: where the host's launch work (Triton's
launcher, TMA descriptors, autograd) and not the GPU sets the pace of small problems.

Host time: calls issued back to back without synchronising (fewer than the launch queue
holds), their wall time over the count. GPU time: attn_bench's queued timing.

  python3 benchmarks/diagnostics/window_host_overhead.py --seq 8192 32768
"""
from __future__ import annotations

import argparse
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(_HERE)), os.path.dirname(_HERE), _HERE]  # repo, benchmarks/, here

import torch  # noqa: E402

from attn_bench import QUEUED_MS, time_ms  # noqa: E402
from kernels.attention import attention  # noqa: E402
from kernels.attention import masks as M  # noqa: E402
from kernels.attention import window_triton as wt  # noqa: E402


def host_us(fn: "Callable[[], object]", calls: int = 60) -> float:
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return host


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--window", type=int, default=256)
    args = ap.parse_args()
    shipped = wt.window_config(torch.device("cuda"), args.dim)

    configs = {"shipped": shipped, "pointers": wt.pointer_loads(shipped)}
    rows = []
    for s in args.seq:
        mk = lambda: torch.randn(1, args.heads, s, args.dim, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                                 requires_grad=True)
        q, k, v = mk(), mk(), mk()
        g = torch.randn_like(q)
        mask = M.SlidingWindow(args.window)
        for label, cfg in configs.items():
            wt.GPU_CONFIGS[args.dim] = cfg  # this process only
            fwd = lambda: attention(q, k, v, mask, backend="triton_window")  # noqa: E731
            fb = lambda: torch.autograd.grad(fwd(), (q, k, v), g)  # noqa: E731
            row = {"seq": s, "config": label, "fwd_host_us": host_us(fwd), "fb_host_us": host_us(fb, 30),
                   "fwd_gpu_ms": time_ms(fwd, queued_ms=QUEUED_MS), "fb_gpu_ms": time_ms(fb, queued_ms=QUEUED_MS)}
            rows.append(row)
            print("[row]", row, flush=True)
    wt.GPU_CONFIGS[args.dim] = shipped
    print(f"\nwindow_host_overhead  {torch.cuda.get_device_name()}  H={args.heads} D={args.dim} window {args.window}")
    print(f"{'S':>7} {'config':<15} {'fwd host us':>11} {'fwd queued ms':>13} {'f+b host us':>11} {'f+b queued ms':>13}")
    for r in rows:
        print(f"{r['seq']:>7} {r['config']:<15} {r['fwd_host_us']:>11.0f} {r['fwd_gpu_ms']:>13.3f} "
              f"{r['fb_host_us']:>11.0f} {r['fb_gpu_ms']:>13.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
