"""Which form of the fused loss's accumulating weight-gradient product runs fastest on cuBLAS?

At N=16384 (V=128256, H=4096, bf16, <= 256 MiB) the loss makes 15 products
``dW (V x H, bf16) += G_c^T (V x 1024) @ X_c (1024 x H)``; they ran at 590 TFLOP/s against
730 for one K=16384 product. This times, round-robin over variants (medians of CUDA-event
regions), the same product with each operand layout, with cuBLAS and cuBLASLt, split into
halves, and the references: one K=16384 product, the K=1024 product into a fresh buffer
(beta=0), and the float32-accumulator form."""
from __future__ import annotations

import statistics

import torch

from common import chunk_shape_parser, region_ms  # benchmarks/gpu/exp/common.py (the script's own folder)


def main() -> None:
    args = chunk_shape_parser().parse_args()
    v, h, k = args.v, args.h, args.k
    dev = "cuda"
    bf = torch.bfloat16
    torch.manual_seed(0)
    g = torch.randn(k, v, device=dev, dtype=bf) * 1e-3  # row-major chunk, as the row kernel writes it
    g_t = g.t().contiguous()  # class-major copy: V x K
    x = torch.randn(k, h, device=dev, dtype=bf)
    x_t = x.t().contiguous()  # H x K
    dw = torch.zeros(v, h, device=dev, dtype=bf)
    fresh = torch.empty_like(dw)
    acc32 = torch.zeros(v, h, device=dev, dtype=torch.float32)
    big_g = torch.randn(16 * k, v, device=dev, dtype=bf) * 1e-3 if k * 16 * v * 2 < 8 << 30 else None
    big_x = torch.randn(16 * k, h, device=dev, dtype=bf)
    half_v = v // 2

    def cur():
        dw.addmm_(g.t(), x)

    def class_major_g():
        dw.addmm_(g_t, x)

    def x_col_major():
        dw.addmm_(g.t(), x_t.t())

    def both():
        dw.addmm_(g_t, x_t.t())

    def transposed_out():
        dw.t().addmm_(x.t(), g)

    def split_v():
        dw[:half_v].addmm_(g[:, :half_v].t(), x)
        dw[half_v:].addmm_(g[:, half_v:].t(), x)

    def split_h():
        dw[:, : h // 2].addmm_(g.t(), x[:, : h // 2])
        dw[:, h // 2 :].addmm_(g.t(), x[:, h // 2 :])

    def beta0():
        torch.mm(g.t(), x, out=fresh)

    def fp32_acc():
        torch.addmm(acc32, g.t(), x, out_dtype=torch.float32, out=acc32)

    def one_big():
        torch.mm(big_g.t(), big_x, out=fresh)

    variants = {
        "current: addmm_(G^T view, X)": (cur, 1),
        "G class-major (V x K contiguous)": (class_major_g, 1),
        "X column-major": (x_col_major, 1),
        "G class-major + X column-major": (both, 1),
        "dW^T.addmm_(X^T, G)": (transposed_out, 1),
        "split in two V halves": (split_v, 1),
        "split in two H halves": (split_h, 1),
        "beta=0 into a fresh buffer (ref)": (beta0, 1),
        "fp32 accumulator (ref)": (fp32_acc, 1),
    }
    if big_g is not None:
        variants["one K=16k product (ref, per 1k)"] = (one_big, 16)
    libs = ["cublas", "cublaslt"]
    results: dict[tuple[str, str], list[float]] = {}
    for lib in libs:
        torch.backends.cuda.preferred_blas_library(lib)
        for fn, _ in variants.values():
            fn()
    torch.cuda.synchronize()
    for _ in range(args.rounds):
        for lib in libs:
            torch.backends.cuda.preferred_blas_library(lib)
            for name, (fn, per) in variants.items():
                ms = region_ms(fn, args.reps) / per
                results.setdefault((name, lib), []).append(ms)
    flops = 2.0 * v * h * k
    print(f"V={v} H={h} K={k} bf16, medians of {args.rounds} rounds of {args.reps} calls")
    print(f"{'variant':40s} {'lib':9s} {'ms':>7s} {'TFLOP/s':>8s} {'min':>7s} {'max':>7s}")
    for (name, lib), xs in results.items():
        med = statistics.median(xs)
        print(f"{name:40s} {lib:9s} {med:7.3f} {flops / med / 1e9:8.1f} {min(xs):7.3f} {max(xs):7.3f}")


if __name__ == "__main__":
    main()
