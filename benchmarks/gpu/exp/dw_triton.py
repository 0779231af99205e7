"""Can a Triton persistent GEMM beat cuBLAS at the fused loss's accumulating weight-gradient product?

At N=16384 (V=128256, H=4096, bf16, <= 256 MiB) the loss makes 15 products
``dW (V x H, bf16) += G_c^T (V x 1024) @ X_c (1024 x H)``. cuBLAS runs them at 1.69-1.79 ms
(two column blocks) against 1.44 ms per 1024 rows inside one K=16384 product: each K=1024
product also reads and writes the whole 1 GiB gradient, and cuBLAS does not hide that
traffic behind the tensor cores. This times, round-robin (medians of CUDA-event regions),
Triton persistent kernels with TMA loads whose epilogue adds the old dW tile, in forms that
may hide it (the old tile loaded before the K loop, flattened tile/K loops, warp
specialisation), against cuBLAS as shipped, and a dX product on a second stream beside it.
Each Triton form is checked against cuBLAS's result first."""
from __future__ import annotations

import statistics
import traceback

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from common import chunk_shape_parser, region_ms  # benchmarks/gpu/exp/common.py (the script's own folder)


@triton.jit
def _dw_acc(g_desc, x_desc, c_desc, c_ptr, M, N, K, stride_cm,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NUM_SMS: tl.constexpr,
            PREFETCH: tl.constexpr, FLATTEN: tl.constexpr, WS: tl.constexpr, GROUP_M: tl.constexpr):
    """C[M, N] += G[K, M]^T @ X[K, N], persistent over output tiles."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    num_tiles = num_m * num_n
    per_group = GROUP_M * num_n
    for tile in tl.range(pid, num_tiles, NUM_SMS, flatten=FLATTEN, warp_specialize=WS):
        group = tile // per_group
        first_m = group * GROUP_M
        rows = min(num_m - first_m, GROUP_M)
        pid_m = first_m + (tile % per_group) % rows
        pid_n = (tile % per_group) // rows
        om = pid_m * BM
        on = pid_n * BN
        if PREFETCH:
            offs_m = om + tl.arange(0, BM)
            offs_n = on + tl.arange(0, BN)
            ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            old = tl.load(ptrs, mask=mask, other=0.0)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kk in range(k_tiles):
            a = g_desc.load([kk * BK, om])
            b = x_desc.load([kk * BK, on])
            acc = tl.dot(a.T, b, acc)
        if PREFETCH:
            acc += old.to(tl.float32)
        else:
            acc += c_desc.load([om, on]).to(tl.float32)
        c_desc.store([om, on], acc.to(tl.bfloat16))


def triton_dw(dw: torch.Tensor, g: torch.Tensor, x: torch.Tensor, cfg: dict, sms: int):
    """The launch closure for one configuration (descriptors built once)."""
    k, m = g.shape
    n = x.shape[1]
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    g_desc = TensorDescriptor.from_tensor(g, [bk, bm])
    x_desc = TensorDescriptor.from_tensor(x, [bk, bn])
    c_desc = TensorDescriptor.from_tensor(dw, [bm, bn])
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    grid = (min(sms, tiles),)

    def run():
        _dw_acc[grid](g_desc, x_desc, c_desc, dw, m, n, k, dw.stride(0), BM=bm, BN=bn, BK=bk,
                      NUM_SMS=grid[0], PREFETCH=cfg["prefetch"], FLATTEN=cfg["flatten"], WS=cfg["ws"],
                      GROUP_M=cfg["group_m"], num_warps=cfg["warps"], num_stages=cfg["stages"])
    return run


def main() -> None:
    args = chunk_shape_parser().parse_args()
    v, h, k = args.v, args.h, args.k
    dev, bf = "cuda", torch.bfloat16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    g = torch.randn(k, v, device=dev, dtype=bf) * 1e-2  # row-major chunk, as the row kernel writes it
    x = torch.randn(k, h, device=dev, dtype=bf)
    w = torch.randn(v, h, device=dev, dtype=bf) * 1e-2
    dx = torch.empty(k, h, device=dev, dtype=bf)
    dw = torch.zeros(v, h, device=dev, dtype=bf)
    half = h // 2

    def cublas_shipped():  # two column blocks, as kernels/lce/chunked.py does on CUDA
        dw[:, :half].addmm_(g.t(), x[:, :half])
        dw[:, half:].addmm_(g.t(), x[:, half:])

    def cublas_whole():
        dw.addmm_(g.t(), x)

    side = torch.cuda.Stream()

    def dx_then_dw():
        torch.mm(g, w, out=dx)
        cublas_shipped()

    def dx_beside_dw():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.mm(g, w, out=dx)
        cublas_shipped()
        torch.cuda.current_stream().wait_stream(side)

    variants: dict[str, object] = {"cuBLAS as shipped (2 column blocks)": cublas_shipped,
                                   "cuBLAS one product": cublas_whole}
    base = dict(BK=64, prefetch=False, flatten=False, ws=False, group_m=1)
    configs = [
        ("128x256 s3 w8", dict(base, BM=128, BN=256, stages=3, warps=8)),
        ("128x256 s4 w8", dict(base, BM=128, BN=256, stages=4, warps=8)),
        ("128x256 s3 w8 prefetch", dict(base, BM=128, BN=256, stages=3, warps=8, prefetch=True)),
        ("128x256 s3 w8 flatten", dict(base, BM=128, BN=256, stages=3, warps=8, flatten=True)),
        ("128x256 s3 w8 ws", dict(base, BM=128, BN=256, stages=3, warps=8, ws=True)),
        ("256x128 s3 w8", dict(base, BM=256, BN=128, stages=3, warps=8)),
        ("256x128 s3 w8 prefetch", dict(base, BM=256, BN=128, stages=3, warps=8, prefetch=True)),
        ("128x128 s4 w8", dict(base, BM=128, BN=128, stages=4, warps=8)),
        ("128x128 s4 w4 prefetch", dict(base, BM=128, BN=128, stages=4, warps=4, prefetch=True)),
        ("128x128 s4 w8 prefetch", dict(base, BM=128, BN=128, stages=4, warps=8, prefetch=True)),
        ("128x256 s3 w8 group8", dict(base, BM=128, BN=256, stages=3, warps=8, group_m=8)),
        ("128x256 BK128 s2 w8", dict(base, BM=128, BN=256, BK=128, stages=2, warps=8)),
    ]
    # correctness first: each form against cuBLAS from the same starting dW
    start = (torch.randn(v, h, device=dev, dtype=bf) * 1e-1)
    dw.copy_(start)
    cublas_whole()
    want = dw.float().clone()
    scale = want.abs().max().item()
    for name, cfg in configs:
        try:
            dw.copy_(start)
            fn = triton_dw(dw, g, x, cfg, sms)
            fn()
            torch.cuda.synchronize()
            err = (dw.float() - want).abs().max().item() / scale
            ok = err < 2e-2
            print(f"check {name:28s} max rel err {err:.2e} {'ok' if ok else 'WRONG'}")
            if ok:
                variants["triton " + name] = fn
        except Exception as e:  # noqa: BLE001 - report each form that does not compile
            print(f"check {name:28s} FAILED: {type(e).__name__}: {str(e)[:300]}")
            traceback.print_exc(limit=2)
    variants["dX then dW (cuBLAS)"] = dx_then_dw
    variants["dX on a side stream beside dW"] = dx_beside_dw
    for fn in variants.values():
        fn()
    torch.cuda.synchronize()
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            results.setdefault(name, []).append(region_ms(fn, args.reps))
    flops = 2.0 * v * h * k
    ref = statistics.median(results["cuBLAS as shipped (2 column blocks)"])
    print(f"V={v} H={h} K={k} bf16, {sms} SMs, medians of {args.rounds} rounds of {args.reps} calls")
    print(f"{'variant':44s} {'ms':>7s} {'TFLOP/s':>8s} {'/shipped':>8s} {'min':>7s} {'max':>7s}")
    for name, xs in results.items():
        med = statistics.median(xs)
        fl = flops * (2 if name.startswith("dX") else 1)
        print(f"{name:44s} {med:7.3f} {fl / med / 1e9:8.1f} {med / ref:8.3f} {min(xs):7.3f} {max(xs):7.3f}")


if __name__ == "__main__":
    main()
