"""A/B of the fused loss's class-major head at N=16384 (V=128256, H=4096, bf16, <= 256 MiB).

With more tokens than the weight gradient's buffer holds logits of, the first H tokens take the
class-major layout (dW written in slabs, each one product over those tokens) and the other
rows 1024-row chunks that add to it, instead of 16 chunks whose 15 accumulating products each
read and write the whole 1 GiB gradient. Contenders, timed round-robin (``lce_bench.py``'s
step): unfused torch.compile (the anchor), ours without the head (as before), ours with the
head under several tail budgets (``class_major.HEAD_TAIL_BYTES``: classes per slab, and what
the chunks after it keep of the 256 MiB), and the head under torch.compile. Each contender's
loss and peak memory above its inputs and gradients is printed."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import kernels.lce.class_major as class_major  # noqa: E402
import kernels.lce.function as function  # noqa: E402
from lce_bench import compiled_unfused, make_inputs, matmul_ceiling_tflops, ours, peak_cuda, step, time_cuda  # noqa: E402

_HEAD = function._class_major_head


def with_head(fn, tail_mib: int | None):
    """``fn`` with the head off (``None``) or on with a tail budget of ``tail_mib``."""
    def run(x, w, t):
        if tail_mib is None:
            function._class_major_head = lambda *a: (0, 0, 0)
        else:
            function._class_major_head = _HEAD
            class_major.HEAD_TAIL_BYTES = tail_mib * 2**20
        return fn(x, w, t)
    return run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--tails", type=int, nargs="+", default=[8, 16, 32, 64], help="head tail budgets, MiB")
    args = p.parse_args()
    n, h, v = args.n, 4096, 128256
    print(f"bf16 matmul ceiling: {matmul_ceiling_tflops():.0f} TFLOP/s", flush=True)
    bf16 = ours(implementation="triton", accum_dtype=torch.bfloat16)
    contenders = {"unfused torch.compile": compiled_unfused(), "ours bf16 dW, row chunks only": with_head(bf16, None)}
    for mib in args.tails:
        head, slab, chunk = class_major.class_major_head(n, h, v, 2, 2, 256 * 2**20, mib * 2**20)
        contenders[f"ours bf16 dW, head {head} / slab {slab} / chunk {chunk}"] = with_head(bf16, mib)
    contenders["ours bf16 dW compiled, head (16 MiB tail)"] = with_head(
        torch.compile(ours(implementation="triton", accum_dtype=torch.bfloat16), fullgraph=True), 16)
    x, w, t = make_inputs(n, h, v, torch.bfloat16, "cuda")
    ready = {}
    for name, fn in contenders.items():
        for _ in range(2):
            loss = step(fn, x, w, t)
        ready[name] = (loss, peak_cuda(fn, x, w, t))
        x.grad = w.grad = None
        torch.cuda.empty_cache()
    names = list(contenders)
    times: dict[str, list[float]] = {k: [] for k in names}
    for rep in range(args.reps):
        for i in range(len(names)):
            name = names[(rep + i) % len(names)]
            times[name] += time_cuda(contenders[name], x, w, t, 1)
    anchor = statistics.median(times[names[0]])
    print(f"N={n} H={h} V={v} bf16, medians of {args.reps} round-robin steps")
    print(f"{'contender':52s} {'ms':>8s} {'vs compile':>10s} {'min':>8s} {'max':>8s} {'MiB':>8s} {'loss':>10s}")
    for name in names:
        ms = statistics.median(times[name])
        loss, peak = ready[name]
        print(f"{name:52s} {ms:8.2f} {ms / anchor:10.3f} {min(times[name]):8.2f} {max(times[name]):8.2f}"
              f" {peak:8.1f} {loss:10.6f}")


if __name__ == "__main__":
    main()
