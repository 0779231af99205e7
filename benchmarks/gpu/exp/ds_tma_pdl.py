"""dS tiles through TMA descriptors (WindowConfig.ds_tma) and programmatic dependent launches
(WindowConfig.pdl), alone and together, and delta fused into the transposed dK/dV kernel, against
the shipped configuration at S=32768, window 256: forward, whole backward and forward+backward
through autograd, all queued; results compared with the shipped ones."""
import dataclasses, os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import torch
from attn_bench import QUEUED_MS, time_ms
from kernels.attention import window_triton as wt

def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())

R = dataclasses.replace
shipped_config = wt.window_config
for hq, hkv, d in ((32, 32, 128), (32, 8, 64)):
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(1, h, 32768, d, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v, do = mk(hq), mk(hkv), mk(hkv), mk(hq)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    sc = d ** -0.5
    cfg = shipped_config(q.device, d)
    o, lse2 = wt.launch_forward(q, k, v, 256, sc, cfg.fwd)
    ref = wt.backward(q, k, v, o, lse2, do, 256, sc, cfg)
    ds_blocks = cfg.dq_from_ds or wt.Blocks(64, 64, 4, 4, tma=True)
    forms = [("shipped", cfg), ("pdl", R(cfg, pdl=True)),
             ("dS through TMA", R(cfg, dq_from_ds=ds_blocks, ds_tma=True)),
             ("dS through TMA + pdl", R(cfg, dq_from_ds=ds_blocks, ds_tma=True, pdl=True)),
             ("delta fused", R(cfg, fused_delta=True)),
             ("delta fused + dS through TMA + pdl", R(cfg, dq_from_ds=ds_blocks, fused_delta=True, ds_tma=True,
                                                     pdl=True))]
    if cfg.dq_from_ds is not None:
        forms.append(("dQ recomputed + pdl", R(cfg, dq_from_ds=None, pdl=True)))
    rows = []
    for name, c in forms:
        got = wt.backward(q, k, v, o, lse2, do, 256, sc, c)
        err = max(rel(a, b) for a, b in zip(got, ref))
        t_bwd = time_ms(lambda: wt.backward(q, k, v, o, lse2, do, 256, sc, c), target_ms=150, queued_ms=QUEUED_MS)
        wt.window_config = lambda dev, dim, c=c: c
        fwd = lambda: wt.window_attention(*leaves, 256, return_lse=False)[0]
        t_fwd = time_ms(fwd, target_ms=150, queued_ms=QUEUED_MS)
        t_fb = time_ms(lambda: torch.autograd.grad(fwd(), leaves, do), target_ms=150, queued_ms=QUEUED_MS)
        wt.window_config = shipped_config
        rows.append((name, t_fwd, t_bwd, t_fb, err))
    wt.window_config = shipped_config
    fwd = lambda: wt.window_attention(*leaves, 256, return_lse=False)[0]
    t_again = time_ms(lambda: torch.autograd.grad(fwd(), leaves, do), target_ms=150, queued_ms=QUEUED_MS)
    print(f"\n{hq}/{hkv}x{d}, S=32768, window 256 (queued ms)\n"
          "| form | forward | whole backward | f+b (autograd) | max rel diff vs shipped |\n|---|---:|---:|---:|---:|")
    for name, a, b, c, e in rows:
        print(f"| {name} | {a:.3f} | {b:.3f} | {c:.3f} | {e:.1e} |")
    print(f"| shipped (again) | | | {t_again:.3f} | |")
