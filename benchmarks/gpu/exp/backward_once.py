"""Run the window backward kernels a few times at S=32768, 32x128, window 256: for ncu."""
import sys, os
sys.path.insert(0, os.getcwd())
import torch
from kernels.attention import window_triton as wt
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, do = (torch.randn(1, 32, 32768, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
cfg = wt.window_config(q.device, 128)
o, lse2 = wt.launch_forward(q, k, v, 256, 128 ** -0.5, cfg.fwd)
for _ in range(3):
    wt.backward(q, k, v, o, lse2, do, 256, 128 ** -0.5, cfg)
torch.cuda.synchronize()
