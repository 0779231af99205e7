"""Run the window forward (Triton and Gluon) a few times at S=32768, 32x128, window 256: for ncu."""
import sys, os
sys.path.insert(0, os.getcwd())
import torch
from kernels.attention import window_gluon as wg, window_triton as wt
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(1, 32, 32768, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
for _ in range(3):
    wt.launch_forward(q, k, v, 256, 128 ** -0.5, wt.window_config(q.device, 128).fwd)
    wg.launch_forward_gluon(q, k, v, 256, 128 ** -0.5, stages=3)
torch.cuda.synchronize()
