"""Block-size search for the sliding-window Triton kernel (``kernels/attention/window_triton.py``).

Times each kernel (forward, dK/dV, dQ) alone over candidate launch shapes on one GPU, checks
every candidate's result against the shipped configuration's, then times the whole
forward+backward with the fastest shapes, the shipped ones and (``--flex``) stock compiled
FlexAttention, in the same run. Kernels and the whole passes are timed queued (calls back to
back, the host running ahead, as in a training step; the whole passes also one call at a time
after an idle GPU, where the host's launch work counts). Useful TFLOP/s count exact (query, key) pairs inside the
window: forward 4·pairs·D, dK/dV 8·pairs·D, dQ 6·pairs·D, forward+backward 14·pairs·D.

  python3 benchmarks/diagnostics/window_tune.py                                  # S=32768, 32×128, window 256
  python3 benchmarks/diagnostics/window_tune.py --dim 64 --heads 32 --kv-heads 8 --seq 8192 --no-flex
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import json
import os
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(_HERE)), os.path.dirname(_HERE), _HERE]  # repo, benchmarks/, here

import torch  # noqa: E402

from attn_bench import QUEUED_MS, time_ms  # noqa: E402
from kernels.attention import attention  # noqa: E402
from kernels.attention import masks as M  # noqa: E402
from kernels.attention import window_triton as wt  # noqa: E402
from kernels.attention.window import WindowAttentionFunction  # noqa: E402

B = wt.Blocks
#: every shape with pointer loads and with TMA loads (the shipped shapes use TMA on Hopper)
FWD = [B(m, n, w, s, t) for (m, n), w, s, t in itertools.product(
    [(64, 32), (64, 64), (128, 32), (128, 64), (128, 128)], (4, 8), (2, 3), (False, True))]
DKDV = [B(m, n, w, s, t) for (m, n), w, s, t in itertools.product(
    [(32, 64), (64, 64), (32, 128), (64, 128), (128, 128), (64, 32)], (4, 8), (2, 3), (False, True))]
DQ = [B(m, n, w, s, t) for (m, n), w, s, t in itertools.product(
    [(64, 32), (64, 64), (128, 32), (128, 64), (32, 64)], (4, 8), (2, 3), (False, True))]
#: the WindowConfig field each searched kernel's shape goes to
FIELDS = {"fwd": "fwd", "dkdv": "dkdv", "dq": "dq", "dqds": "dq_from_ds"}
#: dQ from stored dS: warps and stages only (its tiles are the dK/dV kernel's; 0x0 stands for them)
DQDS = [B(0, 0, w, s, t) for w, s, t in itertools.product((4, 8), (2, 3, 4), (False, True))]


def parse_blocks(text: str) -> wt.Blocks:
    """``64x32/w4/s3``, optionally ``/tma`` (the form ``str(Blocks)`` prints) -> ``Blocks``."""
    try:
        shape, warps, stages, *flags = text.split("/")
        m, n = shape.split("x")
        if not (warps.startswith("w") and stages.startswith("s")) or not set(flags) <= {"tma"}:
            raise ValueError
        return wt.Blocks(int(m), int(n), int(warps[1:]), int(stages[1:]), tma="tma" in flags)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 64x32/w4/s3 or 64x32/w4/s3/tma, got {text!r}") from None


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def timer(device: str) -> Callable[..., float]:
    """CUDA-event median on a GPU; elsewhere (interpreter smoke runs, whose times mean nothing)
    the wall-clock time of one call."""
    if device == "cuda":
        return time_ms

    def wall_ms(fn: Callable[[], Any], **_: Any) -> float:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

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
                row["ms"] = time_fn(lambda: run(blocks), target_ms=150.0, queued_ms=QUEUED_MS)
                row["tflops"] = flop / row["ms"] / 1e9
        except Exception as exc:  # out of shared memory, compile failures: record and go on
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
        rows.append(row)
        print("[row]", json.dumps({k: v for k, v in row.items() if k != "cfg"}), flush=True)
    return rows


def best_of(rows: list[dict[str, Any]], fallback: wt.Blocks) -> wt.Blocks:
    ok = [r for r in rows if "ms" in r]
    return wt.Blocks(**min(ok, key=lambda r: r["ms"])["cfg"]) if ok else fallback


def tuned_config(shipped: wt.WindowConfig, rows: list[dict[str, Any]], best_dkdv: wt.Blocks,
                 best_dqds: wt.Blocks | None) -> wt.WindowConfig:
    """The shipped configuration with the fastest shape of each searched kernel; every other
    field (the dK/dV tiles' orientation) stays the shipped one's, the form
    the shapes were timed in."""
    return dataclasses.replace(shipped, fwd=best_of([r for r in rows if r["kernel"] == "fwd"], shipped.fwd),
                               dkdv=best_dkdv, dq=best_of([r for r in rows if r["kernel"] == "dq"], shipped.dq),
                               dq_from_ds=best_dqds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: --heads (no GQA)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--kernels", nargs="+", default=["fwd", "dkdv", "dq", "dqds"],
                    choices=["fwd", "dkdv", "dq", "dqds", "delta"],
                    help="dqds: dQ from the dS tiles the dK/dV kernel stores (then timed storing them); "
                         "delta: the delta kernel (rowsum(O · dO)), in the dq kernel's shape")
    ap.add_argument("--baseline", default=None, metavar="FILE",
                    help="another copy of window_triton.py (e.g. from another commit) timed whole beside this one")
    ap.add_argument("--flex", action=argparse.BooleanOptionalAction, default=True,
                    help="also time stock compiled flex_attention (compiles: ~30 s)")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="time for the search, shared by the kernels in proportion to their candidates")
    ap.add_argument("--json", default="window_tune.json")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1")
    ap.add_argument("--candidates", type=int, default=None, help="try only the first N shapes per kernel")
    for kernel in ("fwd", "dkdv", "dq", "dqds"):
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
    tr = shipped.dkdv_transposed  # the dK/dV tiles' orientation (and so the dS tiles') the shapes are timed in
    dk, dv, _ = wt.launch_dkdv(q, k, v, do, lse2, delta, w, scale, shipped.dkdv, transposed=tr)
    dq = wt.launch_dq(q, k, v, do, lse2, delta, w, scale, shipped.dq)
    lists = {"fwd": pick(args.fwd_shapes or FWD), "dkdv": pick(args.dkdv_shapes or DKDV),
             "dq": pick(args.dq_shapes or DQ), "dqds": pick(args.dqds_shapes or DQDS), "delta": [shipped.dq]}
    store_ds = "dqds" in args.kernels
    total = sum(len(lists[kernel]) for kernel in args.kernels)
    # each kernel's search gets a share of the budget in proportion to its candidates
    end = lambda kernel: time.time() + args.budget_s * len(lists[kernel]) / total  # noqa: E731
    rows: list[dict[str, Any]] = []
    if "fwd" in args.kernels:
        rows += search("fwd", lists["fwd"], lambda b: wt.launch_forward(q, k, v, w, scale, b), (o, lse2),
                       4.0 * pairs * d, end("fwd"), time_fn)
    if "dkdv" in args.kernels:
        rows += search("dkdv", lists["dkdv"],
                       lambda b: wt.launch_dkdv(q, k, v, do, lse2, delta, w, scale, b, store_ds=store_ds,
                                                transposed=tr)[:2],
                       (dk, dv), 8.0 * pairs * d, end("dkdv"), time_fn)
    if "delta" in args.kernels:
        rows += search("delta", lists["delta"], lambda b: wt.launch_delta(o, do, b), (delta,), 0.0, end("delta"),
                       time_fn)
    if "dq" in args.kernels:
        rows += search("dq", lists["dq"], lambda b: wt.launch_dq(q, k, v, do, lse2, delta, w, scale, b), (dq,),
                       6.0 * pairs * d, end("dq"), time_fn)
    best_dkdv = best_of([r for r in rows if r["kernel"] == "dkdv"], shipped.dkdv)
    best_dqds = shipped.dq_from_ds
    if store_ds:
        tiles = lambda b: wt.Blocks(best_dkdv.block_m, best_dkdv.block_n, b.warps, b.stages, b.tma)  # noqa: E731
        ds = wt.launch_dkdv(q, k, v, do, lse2, delta, w, scale, best_dkdv, store_ds=True, transposed=tr)[2]
        rows += search("dqds", [tiles(b) for b in lists["dqds"]],
                       lambda b: wt.launch_dq_from_ds(q, k, ds, w, scale, best_dkdv, b.warps, b.stages, b.tma,
                                                      transposed=tr), (dq,),
                       2.0 * pairs * d, end("dqds"), time_fn)
        best_dqds = best_of([r for r in rows if r["kernel"] == "dqds"], tiles(B(0, 0, 4, 2)))
        del ds
    tuned = tuned_config(shipped, rows, best_dkdv, best_dqds)

    # whole forward and forward+backward through attention(), shipped vs tuned (vs stock flex)
    mask = M.SlidingWindow(w)
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    whole: dict[str, dict[str, float]] = {}
    contenders: dict[str, Callable[[], torch.Tensor]] = {}
    configs = [("window_shipped", shipped), ("window_tuned", tuned)]
    if tuned.dq_from_ds is not None:
        configs.append(("window_tuned_recompute_dq", dataclasses.replace(tuned, dq_from_ds=None)))
    for label, cfg in configs:
        def fn(cfg: wt.WindowConfig = cfg) -> torch.Tensor:
            wt.GPU_CONFIGS[d] = cfg  # this process only: the registry is the kernel's lookup table
            return attention(*leaves, mask, backend="triton_window")
        contenders[label] = fn
    if args.baseline:
        # a submodule of kernels.attention, so that its relative imports resolve as the shipped one's do
        spec = importlib.util.spec_from_file_location("kernels.attention._window_baseline", args.baseline)
        baseline = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = baseline  # dataclasses look their module up there
        spec.loader.exec_module(baseline)  # type: ignore[union-attr]
        if hasattr(baseline, "window_attention"):  # an older copy carries its own entry point
            contenders["baseline"] = lambda: baseline.window_attention(*leaves, w, scale=scale)[0]
        else:
            contenders["baseline"] = lambda: WindowAttentionFunction.apply(*leaves, w, scale, baseline)[0]
    if args.flex:
        contenders["flex_stock"] = lambda: attention(*leaves, mask, backend="flex")
    outs = {}
    registered = wt.GPU_CONFIGS.get(d)  # put back afterwards (a head dim absent stays absent)
    for label, fn in contenders.items():
        try:
            out = fn()
            outs[label] = (out.detach(), *torch.autograd.grad(out, leaves, do))
            f_ms = time_fn(fn, queued_ms=QUEUED_MS)
            fb_ms = time_fn(lambda: torch.autograd.grad(fn(), leaves, do), queued_ms=QUEUED_MS)
            whole[label] = {"fwd_ms": f_ms, "fwdbwd_ms": fb_ms, "fwd_tflops": 4.0 * pairs * d / f_ms / 1e9,
                            "fwdbwd_tflops": 14.0 * pairs * d / fb_ms / 1e9,
                            # each call alone after the GPU went idle: the host's launch work counts too
                            "fwd_single_ms": time_fn(fn),
                            "fwdbwd_single_ms": time_fn(lambda: torch.autograd.grad(fn(), leaves, do))}
        except Exception as exc:
            whole[label] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]}
        print("[whole]", label, json.dumps(whole[label]), flush=True)
    checks = {}
    if "flex_stock" in outs:
        for label in (*(c[0] for c in configs), "baseline"):
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
    for kernel in ("fwd", "dkdv", "dq", "dqds", "delta"):
        ok = sorted((r for r in rows if r["kernel"] == kernel and "ms" in r), key=lambda r: r["ms"])
        failed = sum(1 for r in rows if r["kernel"] == kernel and "ms" not in r)
        if not ok:
            continue
        ship = next((r for r in ok if r["blocks"] == str(getattr(shipped, FIELDS.get(kernel, "dq")))), None)
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
              f"({r['fwdbwd_tflops']:.0f} TF/s){ratio} | single calls: fwd {r['fwd_single_ms']:.3f}, "
              f"f+b {r['fwdbwd_single_ms']:.3f}")
    for label, errs in checks.items():
        print(f"{label} vs flex_stock rel errs (out, dq, dk, dv): " + ", ".join(f"{e:.1e}" for e in errs))
    print(f"tuned config: {tuned}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
