"""A/B of the fused loss's accumulating dW products made whole or in column blocks, at N=16384.

``kernels.lce.chunked.ACCUMULATE_COLUMN_BLOCKS`` (2 as committed) is set around each of our
steps; unfused torch.compile is the anchor. Steps are timed round-robin (one step of each
contender per round, the starting contender rotating), as ``lce_bench.py`` does, and each
contender's loss and peak memory above its inputs and gradients is printed."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import kernels.lce.chunked as chunked  # noqa: E402
from lce_bench import (  # noqa: E402
    compiled_unfused, make_inputs, matmul_ceiling_tflops, ours, peak_cuda, round_robin_cuda, step)


def with_blocks(fn, blocks: int):
    def run(x, w, t):
        chunked.ACCUMULATE_COLUMN_BLOCKS = blocks
        return fn(x, w, t)
    return run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--reps", type=int, default=9)
    args = p.parse_args()
    n, h, v = args.n, 4096, 128256
    print(f"bf16 matmul ceiling: {matmul_ceiling_tflops():.0f} TFLOP/s", flush=True)
    bf16 = ours(implementation="triton", accum_dtype=torch.bfloat16)
    fp32 = ours(implementation="triton")
    contenders = {
        "unfused torch.compile": compiled_unfused(),
        "ours bf16 dW, whole products": with_blocks(bf16, 1),
        "ours bf16 dW, 2 column blocks": with_blocks(bf16, 2),
        "ours bf16 dW, 4 column blocks": with_blocks(bf16, 4),
        "ours fp32 dW, whole products": with_blocks(fp32, 1),
        "ours fp32 dW, 2 column blocks": with_blocks(fp32, 2),
        "ours bf16 dW compiled, 2 column blocks": with_blocks(
            torch.compile(ours(implementation="triton", accum_dtype=torch.bfloat16), fullgraph=True), 2),
    }
    x, w, t = make_inputs(n, h, v, torch.bfloat16, "cuda")
    ready = {}
    for name, fn in contenders.items():
        for _ in range(2):
            loss = step(fn, x, w, t)
        ready[name] = (loss, peak_cuda(fn, x, w, t))
        x.grad = w.grad = None
        torch.cuda.empty_cache()
    names = list(contenders)
    times = round_robin_cuda(contenders, x, w, t, args.reps)
    anchor = statistics.median(times[names[0]])
    print(f"N={n} H={h} V={v} bf16, medians of {args.reps} round-robin steps")
    print(f"{'contender':42s} {'ms':>8s} {'vs compile':>10s} {'min':>8s} {'max':>8s} {'MiB':>8s} {'loss':>10s}")
    for name in names:
        ms = statistics.median(times[name])
        loss, peak = ready[name]
        print(f"{name:42s} {ms:8.2f} {ms / anchor:10.3f} {min(times[name]):8.2f} {max(times[name]):8.2f}"
              f" {peak:8.1f} {loss:10.6f}")


if __name__ == "__main__":
    main()
