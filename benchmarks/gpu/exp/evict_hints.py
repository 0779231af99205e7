"""L2 eviction hints (evict_first on the output stores, the dS stores and loads, the delta
kernel's loads) against the same kernels without them (window_triton_nohints.py, the previous
commit's module), S=32768, window 256, 32x128 and 32/8x64: bit-identity, then forward and
forward+backward through the window Function in five alternating rounds, each timed queued
(attn_bench's method) and as an 80-call burst after an idle moment."""
import importlib.util, os, statistics, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import torch
from attn_bench import QUEUED_MS, time_ms
from window_forward_gaps import burst_us
from kernels.attention import window_triton as hinted
from kernels.attention.window import WindowAttentionFunction

spec = importlib.util.spec_from_file_location("kernels.attention._window_nohints",
                                              "benchmarks/gpu/exp/window_triton_nohints.py")
plain = importlib.util.module_from_spec(spec); sys.modules[spec.name] = plain; spec.loader.exec_module(plain)
mods = {"no hints": plain, "evict_first hints": hinted}
W = 256
for hq, hkv, d in ((32, 32, 128), (32, 8, 64)):
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(1, h, 32768, d, device="cuda", dtype=torch.bfloat16, generator=g)
    leaves = [mk(hq).requires_grad_(), mk(hkv).requires_grad_(), mk(hkv).requires_grad_()]
    do = mk(hq)
    sc = d ** -0.5
    fwd = {n: (lambda m=m: WindowAttentionFunction.apply(*leaves, W, sc, m)[0]) for n, m in mods.items()}
    fb = {n: (lambda f=f: torch.autograd.grad(f(), leaves, do)) for n, f in fwd.items()}
    outs = {n: (f().detach(), *fb[n]()) for n, f in fwd.items()}
    same = [torch.equal(a, b) for a, b in zip(*outs.values())]
    t = {n: {"fwd q": [], "fwd b80": [], "fb q": [], "fb b80": []} for n in mods}
    for rnd in range(5):
        for n in (list(mods) if rnd % 2 == 0 else list(mods)[::-1]):
            t[n]["fwd q"].append(time_ms(fwd[n], target_ms=100, queued_ms=QUEUED_MS) * 1e3)
            t[n]["fwd b80"].append(burst_us(fwd[n], 80, idle_s=0.2))
            t[n]["fb q"].append(time_ms(fb[n], target_ms=150, queued_ms=QUEUED_MS) * 1e3)
            t[n]["fb b80"].append(burst_us(fb[n], 80, idle_s=0.2))
    print(f"\n{hq}/{hkv}x{d}, S=32768, window {W}: bit-identical out/dq/dk/dv {same}; us, median of 5 "
          f"alternating rounds (min-max)\n| kernels | fwd queued | fwd 80-call burst | f+b queued | f+b 80-call burst |"
          "\n|---|---:|---:|---:|---:|")
    for n, r in t.items():
        cell = lambda xs: f"{statistics.median(xs):.1f} ({min(xs):.0f}-{max(xs):.0f})"
        print(f"| {n} | " + " | ".join(cell(r[k]) for k in ("fwd q", "fwd b80", "fb q", "fb b80")) + " |")
