"""The ~tiny Llama compiled in one graph (torch.compile(model, fullgraph=True), Inductor) on each
attention path with the fused loss, on CUDA in bf16 autocast: loss and gradients against eager."""
import os, sys
sys.path.insert(0, os.getcwd())
import torch
from kernels.model import Llama, LlamaConfig

def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))

print("| attention | loss | result | loss rel diff | worst grad rel diff |\n|---|---|---|---:|---:|")
for backend in ("triton_window", "flex", "sdpa"):
    torch.manual_seed(0)
    cfg = LlamaConfig.tiny(max_seq_len=1024).replace(attn_window=128, attn_backend=backend, loss_impl="fused")
    model = Llama(cfg).cuda()
    ids = torch.randint(0, cfg.vocab_size, (2, 1000), device="cuda")
    params = list(model.parameters())
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            eager = model(ids, ids)
        eg = torch.autograd.grad(eager, params)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got = compiled(ids, ids)
        gg = torch.autograd.grad(got, params)
        print(f"| {backend} | fused | ok | {rel(got, eager):.1e} | {max(rel(a, b) for a, b in zip(gg, eg)):.1e} |")
    except Exception as exc:
        print(f"| {backend} | fused | {type(exc).__name__}: {str(exc).splitlines()[0][:150]} | | |")
