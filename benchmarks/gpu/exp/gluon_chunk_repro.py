"""Which (S, W, chunk, slots) of the chunked Gluon forward fail: one case per process."""
import sys, os
sys.path.insert(0, os.getcwd())
import torch
from kernels.attention import window_gluon as wg, window_triton as wt
s, w, chunk, slots, d = (int(x) for x in sys.argv[1:6])
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(1, 2, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
o, l = wg.launch_forward_gluon_chunked(q, k, v, w, d ** -0.5, chunk=chunk, slots=slots or None)
torch.cuda.synchronize()
o2, l2 = wt.launch_forward(q, k, v, w, d ** -0.5, wt.window_config(q.device, d).fwd)
print("ok", (o.float() - o2.float()).norm().item() / o2.float().norm().item(), (l - l2).abs().max().item())
