"""The Gluon sliding-window forward (``kernels/attention/window_gluon.py``) against the shipped
Triton forward, in one run on a Hopper GPU: correctness over ragged lengths, GQA, head dims and
windows, then queued kernel times per launch shape, side by side, as a ratio.

  python3 benchmarks/window_gluon_bench.py                      # S=32768, 32x128 and 32/8x64, window 256
  python3 benchmarks/window_gluon_bench.py --shapes 4/64/3 8/64/2 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from triton.runtime.errors import OutOfResources  # noqa: E402

from attn_bench import QUEUED_MS, time_ms  # noqa: E402
from window_tune import parse_blocks  # noqa: E402
from kernels.attention import masks as M  # noqa: E402
from kernels.attention import window_gluon as wg  # noqa: E402
from kernels.attention import window_triton as wt  # noqa: E402

#: (batch, query heads, kv heads, S, head dim, window): ragged lengths, GQA, windows past S
CASES = [(1, 2, 2, 1000, 128, 100), (2, 4, 2, 777, 64, 256), (1, 4, 1, 4096, 128, 256), (1, 2, 2, 300, 128, 1),
         (1, 2, 2, 200, 64, 5000), (1, 8, 8, 2048, 128, 64), (1, 3, 3, 129, 128, 130)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def parse_shape(text: str) -> tuple[int, int, int, bool]:
    """``WARPS/BLOCK_N/STAGES``, and ``/q`` to hold the query tile in registers."""
    parts = text.split("/")
    warps, block_n, stages = (int(x) for x in parts[:3])
    return warps, block_n, stages, parts[3:] == ["q"]


def parse_chunked(text: str) -> tuple[int, int, int, int]:
    warps, block_n, slots, chunk = (int(x) for x in text.split("/"))
    return warps, block_n, slots, chunk


def variants(shapes: list[tuple[int, int, int, bool]], chunked: list[tuple[int, int, int, int]],
             ws: list[tuple[int, int, int]] = (), triton_shapes: list = ()) -> dict:
    """Name -> forward(q, k, v, window, scale) for every Gluon variant asked for."""
    out = {}
    for warps, bn, st, q_regs in shapes:
        out[f"gluon w{warps}/n{bn}/s{st}" + ("/q in registers" if q_regs else "")] = (
            lambda w_, b_, s_, r_: lambda q, k, v, win, sc: wg.launch_forward_gluon(
                q, k, v, win, sc, block_n=b_, warps=w_, stages=s_, q_regs=r_))(warps, bn, st, q_regs)
    for warps, bn, slots, chunk in chunked:
        out[f"gluon chunked w{warps}/n{bn}/ring{slots or 'auto'}/c{chunk or 'auto'}"] = (
            lambda w_, b_, r_, c_: lambda q, k, v, win, sc: wg.launch_forward_gluon_chunked(
                q, k, v, win, sc, block_n=b_, warps=w_, slots=r_ or None, chunk=c_ or None))(warps, bn, slots, chunk)
    for stages, qbuf, chunk in ws:
        out[f"gluon warp-specialised s{stages}/q{qbuf}/c{chunk or 'auto'}"] = (
            lambda s_, q_, c_: lambda q, k, v, win, sc: wg.launch_forward_gluon_ws(
                q, k, v, win, sc, stages=s_, qbuf=q_, chunk=c_ or None))(stages, qbuf, chunk)
    for blocks in triton_shapes:
        out[f"triton {blocks}"] = (lambda b_: lambda q, k, v, win, sc: wt.launch_forward(q, k, v, win, sc, b_))(blocks)
    return out


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float) -> torch.Tensor:
    """Float32 attention with the dense window mask (small S only)."""
    s = q.shape[2]
    group = q.shape[1] // k.shape[1]
    kf, vf = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    i = torch.arange(s, device=q.device)
    keep = (i[:, None] - i[None, :] >= 0) & (i[:, None] - i[None, :] < window)
    att = (q.float() @ kf.transpose(-1, -2)) * scale
    return torch.softmax(att.masked_fill(~keep, float("-inf")), -1) @ vf


def check(fns: dict) -> list[dict]:
    rows = []
    g = torch.Generator(device="cuda").manual_seed(1)
    for bsz, hq, hkv, s, d, w in CASES:
        mk = lambda h: torch.randn(bsz, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
        q, k, v = mk(hq), mk(hkv), mk(hkv)
        scale = d ** -0.5
        o_t, l_t = wt.launch_forward(q, k, v, w, scale, wt.window_config(q.device, d).fwd)
        ref = reference(q, k, v, w, scale)
        for name, fn in fns.items():
            try:
                o_g, l_g = fn(q, k, v, w, scale)
                torch.cuda.synchronize()
            except OutOfResources as exc:  # e.g. a ring too large for shared memory at this head dim
                print("[check] skipped", name, str(exc).splitlines()[0][:120], flush=True)
                continue
            row = {"case": f"B{bsz} H{hq}/{hkv} S{s} D{d} W{w}", "shape": name,
                   "out_vs_ref": rel(o_g, ref), "triton_vs_ref": rel(o_t, ref), "lse_vs_triton": rel(l_g, l_t)}
            row["ok"] = row["out_vs_ref"] <= max(2 * row["triton_vs_ref"], 1e-2) and row["lse_vs_triton"] <= 1e-4
            rows.append(row)
            print("[check]", json.dumps(row), flush=True)
    return rows


def timings(fns: dict, seq: list[int], window: int) -> list[dict]:
    rows = []
    for s in seq:
        for hq, hkv, d in ((32, 32, 128), (32, 8, 64)):
            g = torch.Generator(device="cuda").manual_seed(0)
            mk = lambda h: torch.randn(1, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
            q, k, v = mk(hq), mk(hkv), mk(hkv)
            scale = d ** -0.5
            pairs = M.SlidingWindow(window).count_pairs(s, s, heads=hq)
            shipped = wt.window_config(q.device, d).fwd
            base = {"seq": s, "heads": f"{hq}/{hkv}x{d}"}
            t_ms = time_ms(lambda: wt.launch_forward(q, k, v, window, scale, shipped), target_ms=150.0,
                           queued_ms=QUEUED_MS)
            rows.append({**base, "impl": f"triton {shipped}", "ms": t_ms, "tflops": 4.0 * pairs * d / t_ms / 1e9,
                         "vs_triton": 1.0})
            print("[time]", json.dumps(rows[-1]), flush=True)
            for name, fn in fns.items():
                try:
                    ms = time_ms(lambda: fn(q, k, v, window, scale), target_ms=150.0, queued_ms=QUEUED_MS)
                    rows.append({**base, "impl": name, "ms": ms, "tflops": 4.0 * pairs * d / ms / 1e9,
                                 "vs_triton": t_ms / ms})
                except Exception as exc:  # out of shared memory and the like: record, go on
                    rows.append({**base, "impl": name,
                                 "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:160]})
                print("[time]", json.dumps(rows[-1]), flush=True)
            # the Triton kernel once more, after the Gluon ones (drift of the GPU's clocks)
            t2 = time_ms(lambda: wt.launch_forward(q, k, v, window, scale, shipped), target_ms=150.0,
                         queued_ms=QUEUED_MS)
            rows.append({**base, "impl": f"triton {shipped} (again)", "ms": t2, "tflops": 4.0 * pairs * d / t2 / 1e9,
                         "vs_triton": t_ms / t2})
            print("[time]", json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", type=parse_shape, default=[(4, 64, 3, False), (4, 64, 3, True)],
                    metavar="WARPS/BLOCK_N/STAGES[/q]")
    ap.add_argument("--chunked", nargs="*", type=parse_chunked, default=[(4, 64, 0, 0)],
                    metavar="WARPS/BLOCK_N/SLOTS/CHUNK", help="several query blocks per program (0: the default)")
    ap.add_argument("--ws", nargs="*", type=lambda t: tuple(int(x) for x in t.split("/")), default=[(3, 1, 0)],
                    metavar="STAGES/QBUF/CHUNK", help="the warp-specialised forward (CHUNK 0: the default)")
    ap.add_argument("--triton-shapes", nargs="*", type=parse_blocks, default=[], metavar="MxN/wW/sS[/tma]",
                    help="other launch shapes of the Triton forward, timed beside the shipped one")
    ap.add_argument("--seq", nargs="+", type=int, default=[32768])
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--json", default="window_gluon.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or wg.gluon_forward_unsupported(torch.empty(1, device="cuda", dtype=torch.bfloat16)):
        print("window_gluon_bench: needs a Hopper GPU and Triton's Gluon", file=sys.stderr)
        return 2
    fns = variants(args.shapes, args.chunked, args.ws, args.triton_shapes)
    checks = check(fns)
    times = timings(fns, args.seq, args.window)
    with open(args.json, "w") as f:
        json.dump({"when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "checks": checks,
                   "times": times}, f, indent=1)
    bad = [c for c in checks if not c["ok"]]
    print(f"\nchecks: {len(checks) - len(bad)} of {len(checks)} ok" + "".join(
        f"\n  BAD {c['case']} {c['shape']}: out {c['out_vs_ref']:.2e} (triton {c['triton_vs_ref']:.2e}) "
        f"lse {c['lse_vs_triton']:.2e}" for c in bad))
    print(f"\n| S | heads | forward | ms | useful TF/s | triton / this |\n|---:|---|---|---:|---:|---:|")
    for r in times:
        if "ms" in r:
            print(f"| {r['seq']} | {r['heads']} | {r['impl']} | {r['ms']:.3f} | {r['tflops']:.0f} | {r['vs_triton']:.2f}x |")
        else:
            print(f"| {r['seq']} | {r['heads']} | {r['impl']} | — | — | {r['error']} |")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
