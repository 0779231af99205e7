"""Block-size search for the sliding-window Triton kernel (``kernels/attention/window_triton.py``).

Times each kernel (forward, dK/dV, dQ) alone over candidate launch shapes on one GPU, checks
every candidate's result against the shipped configuration's, then times the whole
forward+backward with the fastest shapes, the shipped ones and (``--flex``) stock compiled
FlexAttention, in the same run. Useful TFLOP/s count exact (query, key) pairs inside the
window: forward 4·pairs·D, dK/dV 8·pairs·D, dQ 6·pairs·D, forward+backward 14·pairs·D.

  python3 benchmarks/window_tune.py                                  # S=32768, 32×128, window 256
  python3 benchmarks/window_tune.py --dim 64 --heads 32 --kv-heads 8 --seq 8192 --no-flex
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from attn_bench import time_ms  # noqa: E402
from kernels.attention import attention  # noqa: E402
from kernels.attention import masks as M  # noqa: E402
from kernels.attention import window_triton as wt  # noqa: E402

B = wt.Blocks
FWD = [B(m, n, w, s) for (m, n), w, s in itertools.product(
    [(64, 32), (64, 64), (128, 32), (128, 64), (128, 128)], (4, 8), (2, 3))]
DKDV = [B(m, n, w, s) for (m, n), w, s in itertools.product(
    [(32, 64), (64, 64), (32, 128), (64, 128), (128, 128), (64, 32)], (4, 8), (2, 3))]
DQ = [B(m, n, w, s) for (m, n), w, s in itertools.product(
    [(64, 32), (64, 64), (128, 32), (128, 64), (32, 64)], (4, 8), (2, 3))]


def parse_blocks(text: str) -> wt.Blocks:
    """``64x32/w4/s3`` (the form ``str(Blocks)`` prints) -> ``Blocks(64, 32, 4, 3)``."""
    try:
        shape, warps, stages = text.split("/")
        m, n = shape.split("x")
        if not (warps.startswith("w") and stages.startswith("s")):
            raise ValueError
        return wt.Blocks(int(m), int(n), int(warps[1:]), int(stages[1:]))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 64x32/w4/s3, got {text!r}") from None


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def timer(device: str) -> Callable[..., float]:
    """CUDA-event median on a GPU; a wall-clock median elsewhere (interpreter smoke runs)."""
    if device == "cuda":
        return time_ms

    def wall_ms(fn: Callable[[], Any], **_: Any) -> float:
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return sorted(times)[1]

    return wall_ms


def search(name: str, candidates: list[wt.Blocks], run: Callable[[wt.Blocks], Any],
           reference: Any, flop: float, budget_end: float, time_fn: Callable[..., float]) -> list[dict[str, Any]]:
    rows = []
    for blocks in candidates:
        if time.time() > budget_end:
            print(f"[skip] {name} {blocks}: over budget", flush=True)
            continue
        row: dict[str, Any] = {"kernel": name, "blocks": str(blocks), "cfg": blocks.__dict__}
        try:
            got = run(blocks)
            got = got if isinstance(got, tuple) else (got,)
            errs = [rel(a, b) for a, b in zip(got, reference)]
            row["rel_err"] = max(errs)
            if not max(errs) <= 2e-2:  # NaN fails too
                row["error"] = f"WRONG: rel errs {errs}"
            else:
                row["ms"] = time_fn(lambda: run(blocks), target_ms=150.0)
                row["tflops"] = flop / row["ms"] / 1e9
        except Exception as exc:  # out of shared memory, compile failures: record and go on
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
        rows.append(row)
        print("[row]", json.dumps({k: v for k, v in row.items() if k != "cfg"}), flush=True)
    return rows


def best_of(rows: list[dict[str, Any]], fallback: wt.Blocks) -> wt.Blocks:
    ok = [r for r in rows if "ms" in r]
    return wt.Blocks(**min(ok, key=lambda r: r["ms"])["cfg"]) if ok else fallback


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: --heads (no GQA)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--kernels", nargs="+", default=["fwd", "dkdv", "dq"], choices=["fwd", "dkdv", "dq"])
    ap.add_argument("--flex", action=argparse.BooleanOptionalAction, default=True,
                    help="also time stock compiled flex_attention (compiles: ~30 s)")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="time for the search, shared by the kernels in proportion to their candidates")
    ap.add_argument("--json", default="window_tune.json")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1")
    ap.add_argument("--candidates", type=int, default=None, help="try only the first N shapes per kernel")
    for kernel in ("fwd", "dkdv", "dq"):
        ap.add_argument(f"--{kernel}-shapes", nargs="+", type=parse_blocks, default=None, metavar="MxN/wW/sS",
                        help=f"{kernel} shapes to try instead of the built-in list")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("window_tune: needs a CUDA GPU (or --device cpu under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    time_fn = timer(args.device)
    pick = lambda c: c[: args.candidates]  # noqa: E731
    hkv = args.kv_heads or args.heads
    s, d, w = args.seq, args.dim, args.window
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    g = torch.Generator(device=args.device).manual_seed(0)
    mk = lambda h: torch.randn(1, h, s, d, device=args.device, dtype=dtype, generator=g)  # noqa: E731
    q, k, v, do = mk(args.heads), mk(hkv), mk(hkv), mk(args.heads)
    scale = d ** -0.5
    shipped = wt.window_config(q.device, d)
    pairs = M.SlidingWindow(w).count_pairs(s, s, heads=args.heads)
    o, lse2 = wt.launch_forward(q, k, v, w, scale, shipped.fwd)
    delta = wt.launch_delta(o, do, shipped.dq)
    dk, dv = wt.launch_dkdv(q, k, v, do, lse2, delta, w, scale, shipped.dkdv)
    dq = wt.launch_dq(q, k, v, do, lse2, delta, w, scale, shipped.dq)
    lists = {"fwd": pick(args.fwd_shapes or FWD), "dkdv": pick(args.dkdv_shapes or DKDV),
             "dq": pick(args.dq_shapes or DQ)}
    total = sum(len(lists[kernel]) for kernel in args.kernels)
    # each kernel's search gets a share of the budget in proportion to its candidates
    end = lambda kernel: time.time() + args.budget_s * len(lists[kernel]) / total  # noqa: E731
    rows: list[dict[str, Any]] = []
    if "fwd" in args.kernels:
        rows += search("fwd", lists["fwd"], lambda b: wt.launch_forward(q, k, v, w, scale, b), (o, lse2),
                       4.0 * pairs * d, end("fwd"), time_fn)
    if "dkdv" in args.kernels:
        rows += search("dkdv", lists["dkdv"], lambda b: wt.launch_dkdv(q, k, v, do, lse2, delta, w, scale, b), (dk, dv),
                       8.0 * pairs * d, end("dkdv"), time_fn)
    if "dq" in args.kernels:
        rows += search("dq", lists["dq"], lambda b: wt.launch_dq(q, k, v, do, lse2, delta, w, scale, b), (dq,),
                       6.0 * pairs * d, end("dq"), time_fn)
    tuned = wt.WindowConfig(best_of([r for r in rows if r["kernel"] == "fwd"], shipped.fwd),
                            best_of([r for r in rows if r["kernel"] == "dkdv"], shipped.dkdv),
                            best_of([r for r in rows if r["kernel"] == "dq"], shipped.dq))

    # whole forward and forward+backward through attention(), shipped vs tuned (vs stock flex)
    mask = M.SlidingWindow(w)
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    whole: dict[str, dict[str, float]] = {}
    contenders: dict[str, Callable[[], torch.Tensor]] = {}
    for label, cfg in (("window_shipped", shipped), ("window_tuned", tuned)):
        def fn(cfg: wt.WindowConfig = cfg) -> torch.Tensor:
            wt.GPU_CONFIGS[d] = cfg  # this process only: the registry is the kernel's lookup table
            return attention(*leaves, mask, backend="triton_window")
        contenders[label] = fn
    if args.flex:
        contenders["flex_stock"] = lambda: attention(*leaves, mask, backend="flex")
    outs = {}
    registered = wt.GPU_CONFIGS.get(d)  # put back afterwards (a head dim absent stays absent)
    for label, fn in contenders.items():
        try:
            out = fn()
            outs[label] = (out.detach(), *torch.autograd.grad(out, leaves, do))
            f_ms = time_fn(fn)
            fb_ms = time_fn(lambda: torch.autograd.grad(fn(), leaves, do))
            whole[label] = {"fwd_ms": f_ms, "fwdbwd_ms": fb_ms, "fwd_tflops": 4.0 * pairs * d / f_ms / 1e9,
                            "fwdbwd_tflops": 14.0 * pairs * d / fb_ms / 1e9}
        except Exception as exc:
            whole[label] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]}
        print("[whole]", label, json.dumps(whole[label]), flush=True)
    checks = {}
    if "flex_stock" in outs:
        for label in ("window_shipped", "window_tuned"):
            if label in outs:
                checks[label] = [rel(a, b) for a, b in zip(outs[label], outs["flex_stock"])]
    if registered is None:
        wt.GPU_CONFIGS.pop(d, None)
    else:
        wt.GPU_CONFIGS[d] = registered

    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
            "torch": torch.__version__, "seq": s, "heads": args.heads,
            "kv_heads": hkv, "dim": d, "window": w, "command": " ".join(["python3"] + sys.argv),
            "shipped": {k: str(v) for k, v in shipped.__dict__.items()},
            "tuned": {k: str(v) for k, v in tuned.__dict__.items()}}
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "rows": rows, "whole": whole, "checks_vs_flex": checks}, f, indent=2)

    print(f"\nwindow_tune  {meta['device']}  torch {torch.__version__}  S={s} Hq={args.heads} Hkv={hkv} "
          f"D={d} window {w} bf16")
    for kernel in ("fwd", "dkdv", "dq"):
        ok = sorted((r for r in rows if r["kernel"] == kernel and "ms" in r), key=lambda r: r["ms"])
        failed = sum(1 for r in rows if r["kernel"] == kernel and "ms" not in r)
        if not ok:
            continue
        ship = next((r for r in ok if r["blocks"] == str(getattr(shipped, kernel))), None)
        print(f"{kernel:>5}: best {ok[0]['blocks']:<16} {ok[0]['ms']:.3f} ms {ok[0]['tflops']:.0f} TF/s"
              + (f" | shipped {ship['blocks']} {ship['ms']:.3f} ms" if ship else "")
              + f" | runner-up " + ", ".join(f"{r['blocks']} {r['ms']:.3f}" for r in ok[1:4])
              + (f" | {failed} failed" if failed else ""))
    stock = whole.get("flex_stock", {})
    for label, r in whole.items():
        if "error" in r:
            print(f"{label:<15} {r['error']}")
            continue
        ratio = (f"  vs flex: fwd {stock['fwd_ms'] / r['fwd_ms']:.2f}x, f+b {stock['fwdbwd_ms'] / r['fwdbwd_ms']:.2f}x"
                 if "fwd_ms" in stock else "")
        print(f"{label:<15} fwd {r['fwd_ms']:.3f} ms ({r['fwd_tflops']:.0f} TF/s)  f+b {r['fwdbwd_ms']:.3f} ms "
              f"({r['fwdbwd_tflops']:.0f} TF/s){ratio}")
    for label, errs in checks.items():
        print(f"{label} vs flex_stock rel errs (out, dq, dk, dv): " + ", ".join(f"{e:.1e}" for e in errs))
    print(f"tuned config: {tuned}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
