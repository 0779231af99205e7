"""Does PyTorch's TunableOp find a faster cuBLAS/cuBLASLt solution for the fused loss's GEMMs?

The N=16384 <= 256 MiB route makes 1024-row chunks; its accumulating weight-gradient product
``dW (V x H) += G_c^T @ X_c`` (K=1024, beta=1) runs at 1.69-1.79 ms against 1.44 within one
K=16384 product, and Triton persistent kernels were slower still (dw_triton.py). This tunes
the chunk's three products (logits, dX, the accumulating dW as two column blocks) with
TunableOp, prints every candidate it timed, then times each product with TunableOp off and
on (tuning off, the chosen solutions kept), round-robin, medians of CUDA-event regions."""
from __future__ import annotations

import os
import statistics
import tempfile

import torch
import torch.cuda.tunable as tunable

from common import chunk_shape_parser, region_ms  # benchmarks/gpu/exp/common.py (the script's own folder)


def main() -> None:
    args = chunk_shape_parser().parse_args()
    v, h, k = args.v, args.h, args.k
    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(0)
    g = torch.randn(k, v, device=dev, dtype=bf) * 1e-2
    x = torch.randn(k, h, device=dev, dtype=bf)
    w = torch.randn(v, h, device=dev, dtype=bf) * 1e-2
    dw = torch.zeros(v, h, device=dev, dtype=bf)
    dx = torch.empty(k, h, device=dev, dtype=bf)
    half = h // 2

    def dw_blocks():
        dw[:, :half].addmm_(g.t(), x[:, :half])
        dw[:, half:].addmm_(g.t(), x[:, half:])

    def dw_whole():
        dw.addmm_(g.t(), x)

    def logits():
        torch.mm(x, w.t(), out=g)

    def dx_product():
        torch.mm(g, w, out=dx)

    products = {"dW += (2 column blocks)": dw_blocks, "dW += (whole)": dw_whole,
                "logits": logits, "dX": dx_product}
    results_file = os.path.join(tempfile.mkdtemp(prefix="tunableop-"), "tunableop_results%d.csv")
    tunable.set_filename(results_file)
    tunable.set_max_tuning_duration(2000)
    tunable.set_max_tuning_iterations(50)
    tunable.enable(True)
    tunable.tuning_enable(True)
    for fn in products.values():
        fn()
    torch.cuda.synchronize()
    tunable.tuning_enable(False)
    print("TunableOp results (op signature, params, chosen solution, its ms):")
    for row in tunable.get_results():
        print("  ", row)
    validators = tunable.get_validators()
    print("validators:", validators)
    results: dict[tuple[str, bool], list[float]] = {}
    for _ in range(args.rounds):
        for on in (False, True):
            tunable.enable(on)
            for name, fn in products.items():
                results.setdefault((name, on), []).append(region_ms(fn, args.reps))
    tunable.enable(False)
    flops = 2.0 * v * h * k
    print(f"V={v} H={h} K={k} bf16, medians of {args.rounds} rounds of {args.reps} calls")
    print(f"{'product':26s} {'default ms':>10s} {'tuned ms':>9s} {'tuned/default':>13s} {'TFLOP/s tuned':>13s}")
    for name in products:
        a = statistics.median(results[(name, False)])
        b = statistics.median(results[(name, True)])
        print(f"{name:26s} {a:10.3f} {b:9.3f} {b / a:13.3f} {flops / b / 1e9:13.1f}")


if __name__ == "__main__":
    main()
