"""The dS buffer with the far-edge and diagonal tiles sharing a slot (WindowConfig.packed_ds)
against the shipped unpacked buffer, S=32768, window 256, 32x128 (the shape that stores dS):
bit-identity of dq/dk/dv, the dK/dV and dQ-from-dS kernels alone, the whole backward and the
whole forward+backward through attention(), in alternating rounds (queued ms)."""
import dataclasses, os, statistics, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import torch
from attn_bench import QUEUED_MS, time_ms
from kernels.attention import attention, window_triton as wt
from kernels.attention.masks import SlidingWindow

S, W, HQ, HKV, D = 32768, 256, 32, 32, 128
g = torch.Generator(device="cuda").manual_seed(0)
mk = lambda h: torch.randn(1, h, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
q, k, v, do = mk(HQ), mk(HKV), mk(HKV), mk(HQ)
sc = D ** -0.5
base = wt.window_config(q.device, D)
forms = {"unpacked": dataclasses.replace(base, packed_ds=False), "packed": dataclasses.replace(base, packed_ds=True)}
o, lse2 = wt.launch_forward(q, k, v, W, sc, base.fwd)
delta = wt.launch_delta(o, do, base.dq)
ref = wt.backward(q, k, v, o, lse2, do, W, sc, forms["unpacked"])
got = wt.backward(q, k, v, o, lse2, do, W, sc, forms["packed"])
same = [torch.equal(a, b) for a, b in zip(got, ref)]
print("bit-identical dq/dk/dv:", same, "ds MiB:",
      {n: wt.ds_bytes(q, W, base.dkdv, n == "packed") / 2**20 for n in forms}, flush=True)

leaves = [t.clone().requires_grad_() for t in (q, k, v)]
mask = SlidingWindow(W)
orig = wt.window_config
times = {n: {"dkdv": [], "dqds": [], "bwd": [], "fb": []} for n in forms}
for rnd in range(5):
    for name in (list(forms) if rnd % 2 == 0 else list(forms)[::-1]):
        c = forms[name]
        pack = c.packed_ds
        t = times[name]
        t["dkdv"].append(time_ms(lambda: wt.launch_dkdv(q, k, v, do, lse2, delta, W, sc, c.dkdv, store_ds=True,
                                                        transposed=c.dkdv_transposed, pack=pack),
                                 target_ms=100, queued_ms=QUEUED_MS))
        ds = wt.launch_dkdv(q, k, v, do, lse2, delta, W, sc, c.dkdv, store_ds=True, transposed=c.dkdv_transposed,
                            pack=pack)[2]
        t["dqds"].append(time_ms(lambda: wt.launch_dq_from_ds(q, k, ds, W, sc, c.dkdv, c.dq_from_ds.warps,
                                                              c.dq_from_ds.stages, c.dq_from_ds.tma,
                                                              transposed=c.dkdv_transposed, pack=pack),
                                 target_ms=100, queued_ms=QUEUED_MS))
        del ds
        t["bwd"].append(time_ms(lambda: wt.backward(q, k, v, o, lse2, do, W, sc, c), target_ms=100,
                                queued_ms=QUEUED_MS))
        wt.window_config = lambda dev, d, c=c: c
        t["fb"].append(time_ms(lambda: torch.autograd.grad(attention(*leaves, mask, backend="triton_window"),
                                                           leaves, do), target_ms=150, queued_ms=QUEUED_MS))
        wt.window_config = orig
print(f"\n{HQ}/{HKV}x{D}, S={S}, window {W}: medians of 5 alternating rounds, queued ms (min-max)")
print("| form | dK/dV + dS stores | dQ from dS | whole backward | f+b via attention() |\n|---|---:|---:|---:|---:|")
for name, t in times.items():
    cell = lambda xs: f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"
    print(f"| {name} | {cell(t['dkdv'])} | {cell(t['dqds'])} | {cell(t['bwd'])} | {cell(t['fb'])} |")
