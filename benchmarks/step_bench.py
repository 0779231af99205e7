"""Whole training steps (forward, backward, AdamW) of the Llama-style model, five ways.

For one sliding-window model (window 256 by default) at each sequence length:

  baseline      F.cross_entropy on materialized logits + SDPA with the window as a dense mask
  fused_loss    kernels.lce fused linear+cross-entropy + dense-mask SDPA
  flex          F.cross_entropy + compiled FlexAttention with the window's block mask
  fused+flex    both
  causal_flash  context only: the same shapes with FULL causal attention through flash SDPA
                (a denser model: its useful FLOPs count every causal pair)

Reports tokens/s, MFU on useful FLOPs (model matmuls + attention pairs inside the mask)
against the bf16 matmul ceiling measured in this run and the 989 TFLOP/s datasheet figure,
and peak memory. Prints a table last and writes JSON.

  python benchmarks/step_bench.py                      # ~1B model, seq 8192 and 32768, CUDA
  python benchmarks/step_bench.py --smoke              # tiny CPU run (CI)

``--compile-blocks`` also times each configuration with every transformer block compiled
(``torch.compile(block, fullgraph=True)``, the per-block pattern FSDP2 uses): rows
``<config>/compiled``; a configuration that cannot be traced in one graph reports its error.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from typing import Any, Iterable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from kernels.attention import select_backend  # noqa: E402
from kernels.model import Llama, LlamaConfig, fused_loss_available  # noqa: E402

SPEC_TFLOPS = 989.0
CONFIGS = ("baseline", "fused_loss", "flex", "fused+flex", "causal_flash", "fused+window_kernel")
# CUDA only (the window kernel runs on CPU only in Triton's interpreter): left out of --smoke
GPU_ONLY = ("fused+window_kernel",)


def progress(it: Iterable, total: int, desc: str) -> Iterable:
    """tqdm when installed, else a plain line per item."""
    try:
        from tqdm import tqdm

        return tqdm(it, total=total, desc=desc, file=sys.stderr, leave=False)
    except ImportError:
        def plain():
            for i, x in enumerate(it):
                print(f"  {desc}: {i + 1}/{total}", file=sys.stderr, flush=True)
                yield x
        return plain()


def matmul_ceiling_tflops(device: torch.device, n: int = 8192, reps: int = 20) -> float:
    """Median bf16 n×n×n matmul rate on random data (TFLOP/s)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    return 2 * n**3 / times[len(times) // 2] / 1e12


def model_config(name: str, base: LlamaConfig, window: int, device: torch.device) -> LlamaConfig:
    torch_loss = "torch"
    fused = "fused" if fused_loss_available() else "torch"
    # on CUDA 'auto' would take the window kernel for this mask; the flex rows ask for flex
    flex = "flex" if device.type == "cuda" else "auto"
    return {
        "baseline": base.replace(attn_window=window, attn_backend="sdpa", loss_impl=torch_loss),
        "fused_loss": base.replace(attn_window=window, attn_backend="sdpa", loss_impl=fused),
        "flex": base.replace(attn_window=window, attn_backend=flex, loss_impl=torch_loss),
        "fused+flex": base.replace(attn_window=window, attn_backend=flex, loss_impl=fused),
        "causal_flash": base.replace(attn_window=None, attn_backend="sdpa", loss_impl=torch_loss),
        "fused+window_kernel": base.replace(attn_window=window, attn_backend="triton_window", loss_impl=fused),
    }[name]


def attn_path(cfg: LlamaConfig, seq: int, device: torch.device) -> str:
    hd = cfg.head_dim
    q = torch.empty(1, cfg.n_heads, seq, hd, device=device, requires_grad=True)
    kv = torch.empty(1, cfg.kv_heads, seq, hd, device=device)
    chosen = select_backend(q, kv, kv, cfg.mask(), backend=cfg.attn_backend)
    if chosen == "sdpa":
        return "sdpa-causal" if cfg.attn_window is None else "sdpa-dense-mask"
    return chosen


def run_label(name: str, compiled: bool) -> str:
    """A result row's configuration name: ``<config>/compiled`` with the blocks compiled."""
    return name + ("/compiled" if compiled else "")


def run_config(name: str, cfg: LlamaConfig, seq: int, batch: int, steps: int, warmup: int,
               device: torch.device, compile_blocks: bool = False) -> dict[str, Any]:
    torch.manual_seed(0)
    cuda = device.type == "cuda"
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model = Llama(cfg).to(device)
    if compile_blocks:
        for blk in model.blocks:
            blk.compile(fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)
    inp, tgt = tokens[:, :-1], tokens[:, 1:]
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)

    def step() -> float:
        with amp:
            loss = model(inp, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    times: list[float] = []
    losses: list[float] = []
    for i in progress(range(warmup + steps), warmup + steps, f"{name} S={seq}"):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        loss = step()
        if cuda:
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        losses.append(float(loss.detach()))
        if i >= warmup:
            times.append(dt)
    times.sort()
    median = times[len(times) // 2]
    flops = cfg.train_flops(batch, seq)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else float("nan")
    n_params = model.num_params()
    del model, opt
    return {
        "params": n_params,
        "config": run_label(name, compile_blocks), "seq": seq, "batch": batch, "attn": attn_path(cfg, seq, device),
        "loss_impl": cfg.loss_impl, "step_s": median, "tokens_per_s": batch * seq / median,
        "useful_tflop": flops / 1e12, "achieved_tflops": flops / median / 1e12,
        "peak_gib": peak, "first_loss": losses[0], "last_loss": losses[-1],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--configs", nargs="+", default=None, choices=CONFIGS,
                    help="default: all (all but the CUDA-only ones with --smoke)")
    ap.add_argument("--model", choices=["1b", "tiny"], default="1b")
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU, seq 96, 2 steps")
    ap.add_argument("--compile-blocks", action="store_true",
                    help="also time every configuration with its transformer blocks compiled (rows <config>/compiled)")
    ap.add_argument("--json", default="step_bench.json")
    ap.add_argument("--budget-s", type=float, default=None, help="start no new configuration after this")
    ap.add_argument("--ceiling", type=float, default=None, help="skip measuring; use this TFLOP/s")
    args = ap.parse_args(argv)

    if args.configs is None:
        args.configs = [c for c in CONFIGS if not (args.smoke and c in GPU_ONLY)]
    if args.smoke:
        device = torch.device("cpu")
        base = LlamaConfig.tiny(max_seq_len=256)
        args.seq, args.steps, args.warmup, args.window = [96], 2, 1, 16
    else:
        if not torch.cuda.is_available():
            print("step_bench: needs a CUDA GPU (use --smoke for the CPU run)", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        base = (LlamaConfig.llama_1b if args.model == "1b" else LlamaConfig.tiny)(
            max_seq_len=max(args.seq), compile_pointwise=True)
    ceiling = args.ceiling
    if ceiling is None and device.type == "cuda":
        ceiling = matmul_ceiling_tflops(device)
    results = []
    t_start = time.time()
    runs = [(name, compiled) for name in args.configs for compiled in ((False, True) if args.compile_blocks else (False,))]
    for seq in args.seq:
        for name, compiled in runs:
            label = run_label(name, compiled)
            if args.budget_s is not None and time.time() - t_start > args.budget_s:
                results.append({"config": label, "seq": seq, "error": f"skipped: over the {args.budget_s:.0f} s budget"})
                continue
            cfg = model_config(name, base, args.window, device)
            try:
                r = run_config(name, cfg, seq, args.batch, args.steps, args.warmup, device, compile_blocks=compiled)
            except torch.cuda.OutOfMemoryError as exc:
                r = {"config": label, "seq": seq, "error": f"OOM: {str(exc).splitlines()[0]}"}
            except Exception as exc:  # keep the other rows; report this one
                r = {"config": label, "seq": seq, "error": f"{type(exc).__name__}: {exc}"[:300]}
            if "error" not in r and ceiling:
                r["mfu_measured"] = r["achieved_tflops"] / ceiling
                r["mfu_spec"] = r["achieved_tflops"] / SPEC_TFLOPS
            results.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
            if device.type == "cuda":
                gc.collect()
                torch.cuda.empty_cache()

    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "model": "tiny" if args.smoke else args.model,
        "matmul_params": base.matmul_params(), "window": args.window,
        "ceiling_tflops": ceiling, "spec_tflops": SPEC_TFLOPS, "fused_loss_available": fused_loss_available(),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
    }
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=2)

    base_rows = {r["seq"]: r for r in results if r.get("config") == "baseline" and "error" not in r}
    print(f"\nstep_bench  {meta['device']}  torch {meta['torch']}  model {meta['model']} "
          f"({base.matmul_params() / 1e9:.2f} B matmul params)  window {args.window}  "
          f"bf16 ceiling {ceiling or float('nan'):.0f} TFLOP/s (measured)")
    hdr = f"{'seq':>6} {'config':<28} {'attention':<16} {'loss':<6} {'step ms':>9} {'tok/s':>9} " \
          f"{'TFLOP/s':>8} {'MFU meas':>8} {'MFU spec':>8} {'peak GiB':>8} {'vs base':>7}"
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        if "error" in r:
            print(f"{r['seq']:>6} {r['config']:<28} {r['error'][:80]}")
            continue
        b = base_rows.get(r["seq"])
        ratio = f"{b['step_s'] / r['step_s']:.2f}x" if b else "-"
        mfu = lambda k: f"{100 * r[k]:.1f}%" if k in r else "-"  # noqa: E731
        print(f"{r['seq']:>6} {r['config']:<28} {r['attn']:<16} {r['loss_impl']:<6} {1e3 * r['step_s']:>9.1f} "
              f"{r['tokens_per_s']:>9.0f} {r['achieved_tflops']:>8.1f} {mfu('mfu_measured'):>8} "
              f"{mfu('mfu_spec'):>8} {r['peak_gib']:>8.2f} {ratio:>7}")
    print(f"(JSON: {args.json}; causal_flash is a denser model, shown for context)")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
