"""Sliding-window attention on one GPU: compiled FlexAttention (stock and tuned kernel
options) against SDPA causal (flash), SDPA with a dense boolean window mask, and PyTorch's
native varlen attention with a window where the installed torch has it.

Default problem: B=1, 32 heads × 128, bf16, window 256, S ∈ {8192, 32768, 131072}.
Forward and forward+backward are timed with CUDA events (median); the forward is the
training forward (inputs require grad). Useful TFLOP/s count exact (query, key) pairs inside
the mask: 4·pairs·H·D forward, 14·pairs·H·D forward+backward; SDPA causal is credited with
the same useful work as the others (it computes far more). Block-mask creation is timed
separately (first call, which compiles, and warm calls). Before timing, every variant's
output and gradients are checked against float32 SDPA with the dense mask (S=8192), and
each tuned flex variant against stock flex at every S.

  python benchmarks/attn_bench.py                 # full run (~5 min on an H200)
  python benchmarks/attn_bench.py --seq 32768 --variants stock tma
"""
from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels.attention import BlockMaskCache, attention  # noqa: E402
from kernels.attention import masks as M  # noqa: E402

# Flex variants: (block-mask block size, kernel_options). 'stock' is flex as shipped.
# (ROWS_GUARANTEED_SAFE is NOT valid here: a sliding window leaves rows with no key in some
# processed tiles, and the kernel then produces NaN on an H200.)
_BWD_64x128 = {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128, "bwd_BLOCK_N2": 64,
               "bwd_num_warps": 8, "bwd_num_stages": 3}
VARIANTS: dict[str, tuple[int | tuple[int, int], dict[str, Any]]] = {
    "stock": (128, {}),
    "tma": (128, {"USE_TMA": True}),
    "prescale": (128, {"PRESCALE_QK": True}),
    "blk64": (64, {"fwd_BLOCK_M": 64, "fwd_BLOCK_N": 64, "bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 64,
                   "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 32}),
    "fwd128x64_w8": (128, {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64, "fwd_num_warps": 8, "fwd_num_stages": 3}),
    "fwd128x128_w8": (128, {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 128, "fwd_num_warps": 8, "fwd_num_stages": 2}),
    "fwd64x64_w4": (128, {"fwd_BLOCK_M": 64, "fwd_BLOCK_N": 64, "fwd_num_warps": 4, "fwd_num_stages": 3}),
    "bwd64x128": (128, dict(_BWD_64x128)),
    "bwd32x128_w4": (128, {"bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128,
                           "bwd_BLOCK_N2": 32, "bwd_num_warps": 4, "bwd_num_stages": 3}),
}


#: calls per timed region in the queued timing fill about this many ms
QUEUED_MS = 10.0


def time_ms(fn: Callable[[], Any], *, warmup: int = 3, min_reps: int = 5, target_ms: float = 300.0,
            queued_ms: float = 0.0) -> float:
    """Median CUDA-event time of fn in ms (reps chosen to fill about target_ms).

    By default each call is timed alone after the GPU went idle, so the host's launch work
    before the first kernel counts. With ``queued_ms`` each timed region holds enough calls
    back to back (no synchronisation between them) to fill that many ms, and the time per call
    is the region's over the count: the GPU time when the host queues ahead, as in a training
    step. Each region starts behind one more call issued just before it, so the GPU is busy
    when the region opens instead of waiting for the host to launch its first call (which
    counted that launch once per region: 4 calls per region for a 2 ms call at 10 ms).
    For sub-millisecond calls the two timings differ by the host's per-call overhead."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    est = max(region_ms(fn, 1), 1e-3)
    queued = queued_ms > 0
    batch = max(1, int(queued_ms / est)) if queued else 1
    reps = max(min_reps, min(200, int(target_ms / (est * batch))))
    times = []
    for _ in range(reps):
        if queued:
            fn()  # ahead of the region: the GPU runs it while the host issues the timed calls
        times.append(region_ms(fn, batch))
    times.sort()
    return times[len(times) // 2]


def region_ms(fn: Callable[[], Any], calls: int) -> float:
    """ms per call of ``calls`` calls issued back to back between two CUDA events."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(calls):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / calls


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def varlen_fn() -> Callable | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn if "window_size" in inspect.signature(varlen_attn).parameters else None


class Problem:
    def __init__(self, s: int, heads: int, dim: int, window: int, seed: int) -> None:
        g = torch.Generator(device="cuda").manual_seed(seed)
        mk = lambda: torch.randn(1, heads, s, dim, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                                 generator=g).requires_grad_()
        self.q, self.k, self.v = mk(), mk(), mk()
        self.g = torch.randn(1, heads, s, dim, device="cuda", dtype=torch.bfloat16, generator=g)
        self.s, self.heads, self.dim, self.window = s, heads, dim, window
        self.mask = M.sliding_window(window)

    def grads_of(self, f: Callable[[], torch.Tensor], leaves: tuple[torch.Tensor, ...] | None = None,
                 to_bhsd: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> tuple[torch.Tensor, ...]:
        out = f()
        grads = torch.autograd.grad(out, leaves or (self.q, self.k, self.v), self.g)
        return (out.detach(), *(to_bhsd(t) for t in grads))


def combine_best(rows: list[dict[str, Any]], s: int) -> tuple[int | tuple[int, int], dict[str, Any]] | None:
    """Forward and backward are separate kernels: join the forward options of the variant with
    the fastest forward and the backward options of the one with the fastest backward (when
    they share a block-mask block size and differ)."""
    swept = [r for r in rows if r["seq"] == s and r["impl"].startswith("flex_") and "fwdbwd_ms" in r]
    if not swept:
        return None
    bf = min(swept, key=lambda r: r["fwd_ms"])["impl"][5:]
    bb = min(swept, key=lambda r: r["fwdbwd_ms"] - r["fwd_ms"])["impl"][5:]
    if bf == bb or VARIANTS[bf][0] != VARIANTS[bb][0]:
        return None
    opts = {k: v for k, v in VARIANTS[bf][1].items() if not k.startswith("bwd_")}
    opts.update({k: v for k, v in VARIANTS[bb][1].items() if not k.startswith("fwd_")})
    print(f"[combined] forward options from {bf}, backward from {bb}: {opts}", flush=True)
    return VARIANTS[bf][0], opts


def make_fns(p: Problem, variants: list[str], caches: dict[str, BlockMaskCache],
             baselines: bool = True) -> dict[str, Callable]:
    fns: dict[str, Callable] = {}
    if baselines:
        add_baselines(p, fns)
        # the dedicated sliding-window kernel (kernels/attention/window_triton.py; auto's choice on CUDA)
        fns["triton_window"] = lambda: attention(p.q, p.k, p.v, p.mask, backend="triton_window")
    for name in variants:
        bs, opts = VARIANTS[name]
        cache = caches.setdefault(name, BlockMaskCache())
        fns[f"flex_{name}"] = (lambda bs=bs, opts=opts, cache=cache: attention(
            p.q, p.k, p.v, p.mask, backend="flex", kernel_options=opts or None, block_size=bs, cache=cache))
    return fns


def add_baselines(p: Problem, fns: dict[str, Callable]) -> None:
    fns["sdpa_causal"] = lambda: F.scaled_dot_product_attention(p.q, p.k, p.v, is_causal=True)
    if p.s <= 32768:
        dense = p.mask.dense(p.s, device="cuda")
        fns["sdpa_dense_window"] = lambda: F.scaled_dot_product_attention(p.q, p.k, p.v, attn_mask=dense)
    vl = varlen_fn()
    if vl is not None:
        cu = torch.tensor([0, p.s], device="cuda", dtype=torch.int32)
        # its own (S, H, D) leaves, so that no layout copy is timed
        p.varlen_leaves = tuple(t.detach()[0].transpose(0, 1).contiguous().requires_grad_() for t in (p.q, p.k, p.v))

        def varlen():
            q, k, v = p.varlen_leaves
            o = vl(q, k, v, cu, cu, p.s, p.s, window_size=(p.window - 1, 0))
            return o.transpose(0, 1).unsqueeze(0)
        fns["varlen_window"] = varlen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, nargs="+", default=[8192, 32768, 131072])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--sweep-seq", type=int, default=32768,
                    help="run every variant at this S (first); elsewhere only stock and the best")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting new variants after this")
    ap.add_argument("--json", default="attn_bench.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("attn_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    t_start = time.time()
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    mask_times: list[dict[str, Any]] = []
    caches: dict[str, BlockMaskCache] = {}
    broken: set[str] = set()

    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):  # many (options, shape) pairs in one process
            setattr(torch._dynamo.config, knob, max(256, getattr(torch._dynamo.config, knob)))
    order = sorted(args.seq, key=lambda x: (x != args.sweep_seq, x))
    best: str | None = None
    for s in order:
        if s != args.sweep_seq and args.sweep_seq in args.seq:
            swept = [r for r in rows if r["seq"] == args.sweep_seq and r["impl"].startswith("flex_")
                     and "fwdbwd_ms" in r]
            best = min(swept, key=lambda r: r["fwdbwd_ms"])["impl"][5:] if swept else None
            variants = list(dict.fromkeys(v for v in ("stock", best) if v))
        else:
            variants = args.variants
        p = Problem(s, args.heads, args.dim, args.window, seed=s)
        # block-mask creation: first call (compiles for this shape) and warm calls
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        BlockMaskCache().get(p.mask, 1, args.heads, s, s, "cuda")
        torch.cuda.synchronize()
        first = (time.perf_counter() - t0) * 1e3
        warm = time_ms(lambda: BlockMaskCache().get(p.mask, 1, args.heads, s, s, "cuda"), min_reps=5, target_ms=50)
        mask_times.append({"seq": s, "first_ms": first, "warm_ms": warm})
        print(f"[mask] S={s} first {first:.1f} ms, warm {warm:.3f} ms", flush=True)

        fns = make_fns(p, [v for v in variants if v not in broken], caches)
        pairs = p.mask.count_pairs(s, s, heads=args.heads)
        fwd_flop = 4.0 * pairs * args.dim
        ref = None
        if s == min(args.seq):  # correctness against float32 dense-mask SDPA
            q32, k32, v32 = (t.detach().float().requires_grad_() for t in (p.q, p.k, p.v))
            out32 = F.scaled_dot_product_attention(q32, k32, v32, attn_mask=p.mask.dense(s, device="cuda"))
            ref = (out32.detach(), *torch.autograd.grad(out32, (q32, k32, v32), p.g.float()))
            del q32, k32, v32, out32
        stock = None
        queue = list(fns.items())
        while queue:
            name, fn = queue.pop(0)
            if time.time() - t_start > args.budget_s:
                print(f"[skip] {name} S={s}: over the {args.budget_s:.0f} s budget", flush=True)
                continue
            row: dict[str, Any] = {"seq": s, "impl": name}
            try:
                tc = time.perf_counter()
                if name == "varlen_window":
                    got = p.grads_of(fn, p.varlen_leaves, lambda t: t.transpose(0, 1).unsqueeze(0))
                else:
                    got = p.grads_of(fn)
                row["first_call_s"] = time.perf_counter() - tc
                if ref is not None and name != "sdpa_causal":
                    errs = [rel(a, b) for a, b in zip(got, ref)]
                    checks.append({"seq": s, "impl": name, "vs": "fp32 dense SDPA", "rel_err": errs})
                    if not max(errs) <= 2e-2:  # NaN fails too
                        row["error"] = f"WRONG vs fp32 reference: rel errs {errs}"
                if name == "flex_stock":
                    stock = got
                elif name.startswith("flex_") and stock is not None:
                    errs = [rel(a, b) for a, b in zip(got, stock)]
                    checks.append({"seq": s, "impl": name, "vs": "flex_stock", "rel_err": errs})
                    if not max(errs) <= 2e-2:  # NaN fails too
                        row["error"] = f"WRONG vs stock flex: rel errs {errs}"
                del got
                if "error" not in row:
                    row["fwd_ms"] = time_ms(fn)
                    leaves = p.varlen_leaves if name == "varlen_window" else (p.q, p.k, p.v)
                    # autograd.grad: fresh gradients, no accumulation kernels in the timing
                    row["fwdbwd_ms"] = time_ms(lambda: torch.autograd.grad(fn(), leaves, p.g))
                    row["fwd_tflops"] = fwd_flop / row["fwd_ms"] / 1e9
                    row["fwdbwd_tflops"] = 3.5 * fwd_flop / row["fwdbwd_ms"] / 1e9
                    # the same with the host queueing calls ahead (no launch gaps), as in training
                    row["fwd_queued_ms"] = time_ms(fn, queued_ms=QUEUED_MS)
                    row["fwdbwd_queued_ms"] = time_ms(lambda: torch.autograd.grad(fn(), leaves, p.g),
                                                      queued_ms=QUEUED_MS)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
                if name.startswith("flex_"):
                    broken.add(name[5:])
            rows.append(row)
            print("[row]", json.dumps(row), flush=True)
            if not queue and s == args.sweep_seq and "combined" not in VARIANTS:
                combined = combine_best(rows, s)
                if combined is not None:
                    VARIANTS["combined"] = combined
                    queue = list(make_fns(p, ["combined"], caches, baselines=False).items())
        del p, fns
        gc.collect()
        torch.cuda.empty_cache()

    dev = torch.cuda.get_device_name()
    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": dev,
            "torch": torch.__version__, "heads": args.heads, "dim": args.dim, "window": args.window,
            "dtype": "bfloat16", "batch": 1, "command": " ".join(["python"] + sys.argv)}
    meta["best_variant"] = best
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "rows": rows, "checks": checks, "mask_creation": mask_times,
                   "variants": {k: [v[0], v[1]] for k, v in VARIANTS.items()}}, f, indent=2, default=str)

    print(f"\nattn_bench  {dev}  torch {torch.__version__}  B=1 H={args.heads} D={args.dim} bf16 "
          f"window {args.window}")
    hdr = f"{'S':>7} {'impl':<20} {'fwd ms':>8} {'f+b ms':>8} {'fwd TF/s':>8} {'f+b TF/s':>8} " \
          f"{'vs sdpa':>8} {'vs stock':>8} {'queued: fwd':>11} {'f+b':>7} {'vs stock':>8}"
    print(hdr)
    print("-" * len(hdr))
    for s in args.seq:
        sel = [r for r in rows if r["seq"] == s]
        base = next((r for r in sel if r["impl"] == "sdpa_causal" and "fwdbwd_ms" in r), None)
        stock = next((r for r in sel if r["impl"] == "flex_stock" and "fwdbwd_ms" in r), None)
        for r in sel:
            if "fwdbwd_ms" not in r:
                print(f"{s:>7} {r['impl']:<20} {r.get('error', 'skipped')[:70]}")
                continue
            vs = lambda b, key="fwdbwd_ms": f"{b[key] / r[key]:.2f}x" if b else "-"  # noqa: E731
            print(f"{s:>7} {r['impl']:<20} {r['fwd_ms']:>8.3f} {r['fwdbwd_ms']:>8.3f} {r['fwd_tflops']:>8.1f} "
                  f"{r['fwdbwd_tflops']:>8.1f} {vs(base):>8} {vs(stock):>8} {r['fwd_queued_ms']:>11.3f} "
                  f"{r['fwdbwd_queued_ms']:>7.3f} {vs(stock, 'fwdbwd_queued_ms'):>8}")
    for m in mask_times:
        print(f"block mask S={m['seq']}: first {m['first_ms']:.1f} ms, warm {m['warm_ms']:.3f} ms")
    print("(ratios are forward+backward speedups; 'queued': %.0f ms of calls per timed region, the host running "
          "ahead; JSON: %s)" % (QUEUED_MS, args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
