"""Do the fused loss's three cuBLAS products run faster as column or row blocks?

The first call of ``dw_accumulate.py`` (2026-12-01 18:13) found the accumulating dW product
(V x H += (V x 1024) @ (1024 x H), bf16) 13 % faster as two products over halves of H (1.691
against 1.946 ms). This times, round-robin (medians of CUDA-event regions), each of the loss's
products at the N=16384 / <= 256 MiB chunk shape (1024 rows, V=128256, H=4096, bf16) whole and
split into 2, 4 or 8 blocks of output columns or rows, in both orientations where the output
can be written transposed:

- ``dW += G^T X`` (accumulating, beta=1) and ``dW = G^T X`` (the first chunk, beta=0);
- ``dX_c = G W`` (K = V);
- ``logits_c = X_c W^T`` (K = H).
"""
from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from common import chunk_shape_parser, region_ms  # benchmarks/gpu/exp/common.py (the script's own folder)


def blocks(n: int, parts: int) -> list[slice]:
    step = -(-n // parts)
    step = -(-step // 128) * 128  # whole 128-wide tiles
    return [slice(s, min(s + step, n)) for s in range(0, n, step)]


def product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool,
            col_parts: int, row_parts: int) -> Callable[[], None]:
    """``out (+)= a @ b`` as row_parts x col_parts products over blocks of ``out``."""
    rows, cols = blocks(out.shape[0], row_parts), blocks(out.shape[1], col_parts)

    def run() -> None:
        for r in rows:
            for c in cols:
                if accumulate:
                    out[r, c].addmm_(a[r], b[:, c])
                else:
                    torch.mm(a[r], b[:, c], out=out[r, c])

    return run


def main() -> None:
    p = chunk_shape_parser(rounds=5)
    p.add_argument("--only", nargs="*", default=None, help="product names to time")
    args = p.parse_args()
    v, h, k = args.v, args.h, args.k
    bf = torch.bfloat16
    torch.manual_seed(0)
    g = torch.randn(k, v, device="cuda", dtype=bf) * 1e-3  # dlogits chunk, row-major
    x = torch.randn(k, h, device="cuda", dtype=bf)
    w = torch.randn(v, h, device="cuda", dtype=bf) * 1e-2
    dw = torch.zeros(v, h, device="cuda", dtype=bf)
    dx = torch.empty(k, h, device="cuda", dtype=bf)
    logits = torch.empty(k, v, device="cuda", dtype=bf)

    suites: dict[str, tuple[float, dict[str, Callable[[], None]]]] = {}
    for name, accumulate in (("dW += G^T X", True), ("dW = G^T X", False)):
        forms = {}
        for cp in (1, 2, 4, 8):
            for rp in (1, 2):
                forms[f"dW {cp} col x {rp} row"] = product(dw, g.t(), x, accumulate, cp, rp)
        for cp in (1, 2, 4):
            # the same output written as its transpose: dW^T (H x V) (+)= X^T G
            forms[f"dW^T {cp} col-of-dW blocks"] = product(dw.t(), x.t(), g, accumulate, 1, cp)
        suites[name] = (2.0 * v * h * k, forms)
    suites["dX = G W"] = (2.0 * v * h * k, {
        f"{cp} col x {rp} row": product(dx, g, w, False, cp, rp) for cp in (1, 2, 4) for rp in (1, 2)
    })
    suites["logits = X W^T"] = (2.0 * v * h * k, {
        f"{cp} col x {rp} row": product(logits, x, w.t(), False, cp, rp) for cp in (1, 2, 4, 8) for rp in (1, 2)
    })
    if args.only:
        suites = {n: s for n, s in suites.items() if n in args.only}

    for _, forms in suites.values():
        for fn in forms.values():
            fn()
    torch.cuda.synchronize()
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for suite, (_, forms) in suites.items():
            for form, fn in forms.items():
                results.setdefault((suite, form), []).append(region_ms(fn, args.reps))
    print(f"V={v} H={h} K={k} bf16, medians of {args.rounds} rounds of {args.reps} calls")
    print(f"{'product':16s} {'form':28s} {'ms':>7s} {'TFLOP/s':>8s} {'min':>7s} {'max':>7s} {'vs whole':>8s}")
    for suite, (flops, forms) in suites.items():
        whole = statistics.median(results[(suite, next(iter(forms)))])
        for form in forms:
            xs = results[(suite, form)]
            med = statistics.median(xs)
            print(f"{suite:16s} {form:28s} {med:7.3f} {flops / med / 1e9:8.1f} {min(xs):7.3f} {max(xs):7.3f}"
                  f" {med / whole:8.3f}")


if __name__ == "__main__":
    main()
