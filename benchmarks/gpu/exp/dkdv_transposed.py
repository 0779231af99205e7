"""The dK/dV kernel on transposed (keys x queries) tiles against the shipped backward at
S=32768, window 256: 32x128 and 32/8x64, kernels and whole backward queued, results compared."""
import dataclasses, os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import torch
from attn_bench import QUEUED_MS, time_ms
from kernels.attention import window_triton as wt

def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())

for hq, hkv, d in ((32, 32, 128), (32, 8, 64)):
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(1, h, 32768, d, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v, do = mk(hq), mk(hkv), mk(hkv), mk(hq)
    sc = d ** -0.5
    cfg = wt.window_config(q.device, d)
    o, lse2 = wt.launch_forward(q, k, v, 256, sc, cfg.fwd)
    delta = wt.launch_delta(o, do, cfg.dq)
    ref = wt.backward(q, k, v, o, lse2, do, 256, sc, cfg)
    rows = []
    for name, c in (("shipped", cfg), ("transposed", dataclasses.replace(cfg, dkdv_transposed=True)),
                    ("transposed, dQ recomputed", dataclasses.replace(cfg, dkdv_transposed=True, dq_from_ds=None)),
                    ("shipped, dQ recomputed", dataclasses.replace(cfg, dq_from_ds=None))):
        got = wt.backward(q, k, v, o, lse2, do, 256, sc, c)
        errs = [rel(a, b) for a, b in zip(got, ref)]
        store = c.dq_from_ds is not None
        t_dkdv = time_ms(lambda: wt.launch_dkdv(q, k, v, do, lse2, delta, 256, sc, c.dkdv, store_ds=store,
                                                transposed=c.dkdv_transposed),
                         target_ms=150, queued_ms=QUEUED_MS)
        t_bwd = time_ms(lambda: wt.backward(q, k, v, o, lse2, do, 256, sc, c), target_ms=150, queued_ms=QUEUED_MS)
        rows.append((name, t_dkdv, t_bwd, max(errs)))
    t_again = time_ms(lambda: wt.backward(q, k, v, o, lse2, do, 256, sc, cfg), target_ms=150, queued_ms=QUEUED_MS)
    print(f"\n{hq}/{hkv}x{d}, S=32768, window 256 (queued ms)\n| backward | dK/dV kernel | whole backward | max rel diff vs shipped |\n|---|---:|---:|---:|")
    for name, a, b, e in rows:
        print(f"| {name} | {a:.3f} | {b:.3f} | {e:.1e} |")
    print(f"| shipped (again) | | {t_again:.3f} | |")
