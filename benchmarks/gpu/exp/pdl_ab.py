"""Programmatic dependent launch (WindowConfig.pdl) against the shipped window kernels, timed in
alternation (five rounds, each form's forward and forward+backward queued at S=32768, window 256,
32x128 and 32/8x64), so that drift between calls does not decide it: medians and per-round ratios."""
import dataclasses, os, statistics, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import torch
from attn_bench import QUEUED_MS, time_ms
from kernels.attention import window_triton as wt

shipped_config = wt.window_config
for hq, hkv, d in ((32, 32, 128), (32, 8, 64)):
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(1, h, 32768, d, device="cuda", dtype=torch.bfloat16, generator=g)
    leaves = [mk(h).requires_grad_() for h in (hq, hkv, hkv)]
    do = mk(hq)
    cfg = shipped_config(leaves[0].device, d)
    forms = {"shipped": cfg, "pdl": dataclasses.replace(cfg, pdl=True)}
    times = {(f, k): [] for f in forms for k in ("fwd", "fb")}
    for rnd in range(5):
        for name in (list(forms) if rnd % 2 == 0 else list(forms)[::-1]):
            wt.window_config = lambda dev, dim, c=forms[name]: c
            fwd = lambda: wt.window_attention(*leaves, 256, return_lse=False)[0]
            times[name, "fwd"].append(time_ms(fwd, target_ms=100, queued_ms=QUEUED_MS))
            times[name, "fb"].append(time_ms(lambda: torch.autograd.grad(fwd(), leaves, do), target_ms=100,
                                             queued_ms=QUEUED_MS))
            wt.window_config = shipped_config
    print(f"\n{hq}/{hkv}x{d}, S=32768, window 256, queued ms, median of 5 alternating rounds\n"
          "| form | forward | f+b | f+b rounds |\n|---|---:|---:|---|")
    for name in forms:
        print(f"| {name} | {statistics.median(times[name, 'fwd']):.3f} | {statistics.median(times[name, 'fb']):.3f} | "
              + " / ".join(f"{t:.3f}" for t in times[name, "fb"]) + " |")
    ratios = [a / b for a, b in zip(times["pdl", "fb"], times["shipped", "fb"])]
    print(f"pdl / shipped f+b per round: " + " ".join(f"{r:.3f}" for r in ratios))
