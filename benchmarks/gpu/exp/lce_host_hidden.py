"""How much of a fused-loss step's measured time is the GPU waiting for the host?

For each contender, round-robin, three numbers per step:
- ``idle start``: CUDA events around one fwd+bwd launched onto an idle GPU (``lce_bench.py``'s
  timing): the GPU waits for the host's first launches and for any launch the host is late with;
- ``queued``: the same step launched behind ~30 ms of queued GPU spinning, so the host has
  launched most of the step before the GPU reaches it (what a step inside a training loop sees);
- ``host``: the host's time to launch the step (no synchronisation inside it).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lce_bench import compiled_unfused, make_inputs, ours, step  # noqa: E402


def one(fn, x, w, t, queued: bool) -> tuple[float, float]:
    x.grad = w.grad = None
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if queued:
        torch.cuda._sleep(60_000_000)  # ~30 ms at 1.98 GHz
    start.record()
    t0 = time.perf_counter()
    fn(x, w, t).backward()
    host = (time.perf_counter() - t0) * 1e3
    end.record()
    end.synchronize()
    return start.elapsed_time(end), host


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--reps", type=int, default=9)
    args = p.parse_args()
    x, w, t = make_inputs(args.n, 4096, 128256, torch.bfloat16, "cuda")
    contenders = {
        "unfused torch.compile": compiled_unfused(),
        "ours bf16 dW": ours(implementation="triton", accum_dtype=torch.bfloat16),
        "ours fp32 dW": ours(implementation="triton"),
    }
    for fn in contenders.values():
        for _ in range(2):
            step(fn, x, w, t)
    names = list(contenders)
    res: dict[tuple[str, str], list[float]] = {}
    for rep in range(args.reps):
        for i in range(len(names)):
            name = names[(rep + i) % len(names)]
            for queued in (False, True):
                gpu, host = one(contenders[name], x, w, t, queued)
                mode = "queued" if queued else "idle start"
                res.setdefault((name, mode), []).append(gpu)
                res.setdefault((name, "host " + mode), []).append(host)
    print(f"N={args.n}, medians of {args.reps} round-robin steps, ms")
    print(f"{'contender':24s} {'idle start':>10s} {'queued':>8s} {'host':>8s} {'host (queued)':>14s}")
    for name in names:
        med = {m: statistics.median(res[(name, m)]) for m in ("idle start", "queued", "host idle start", "host queued")}
        print(f"{name:24s} {med['idle start']:10.2f} {med['queued']:8.2f} {med['host idle start']:8.2f}"
              f" {med['host queued']:14.2f}")


if __name__ == "__main__":
    main()
