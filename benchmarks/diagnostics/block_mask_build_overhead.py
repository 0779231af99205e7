"""Host cost of building a FlexAttention block mask: a new ``torch.compile`` wrapper per build
(``create_block_mask(..., _compile=True)``) against the compiled builder made once (what
``kernels/attention/block_mask.py`` does). Small S, so the wrapper's cost shows.

    python3 benchmarks/diagnostics/block_mask_build_overhead.py --seq 256 --device cpu
"""
from __future__ import annotations

import argparse
import time
import warnings

import torch
from torch.nn.attention.flex_attention import create_block_mask

from kernels.attention import masks as M


def median_ms(fn, reps: int, device: str) -> float:
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=21)
    args = parser.parse_args()
    warnings.simplefilter("ignore", DeprecationWarning)
    mask_mod = M.sliding_window(args.window).to(args.device).as_mask_mod()
    compiled_once = torch.compile(create_block_mask)
    s, dev = args.seq, args.device
    variants = {
        "new torch.compile wrapper per build": lambda: create_block_mask(
            mask_mod, None, None, s, s, device=dev, BLOCK_SIZE=128, _compile=True),
        "builder compiled once (ours)": lambda: compiled_once(mask_mod, None, None, s, s, device=dev, BLOCK_SIZE=128),
    }
    for fn in variants.values():  # compile, then one warm call
        fn(), fn()
    results = {name: median_ms(fn, args.reps, dev) for name, fn in variants.items()}
    ours = results["builder compiled once (ours)"]
    print(f"block mask build, S={s}, window {args.window}, {dev}, median of {args.reps}")
    print(f"| {'builder':38s} | {'ms':>8s} | {'this / ours':>11s} |")
    for name, ms in results.items():
        print(f"| {name:38s} | {ms:8.3f} | {ms / ours:10.2f}x |")


if __name__ == "__main__":
    main()
