#!/usr/bin/env bash
# One device call (lent H200): the kernels tests on the final code (direct launches, misaligned
# inputs copied to an aligned base), whether Triton's own launch of the pointer-load forward is right
# on a misaligned base (the failure that made the window path copy such inputs), host time per call,
# and the attention bench at 8k and 32k against stock flex. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels 2>&1 | tee "$OUT/tests.log" | tail -2
timeout 60 python3 - <<'PY' 2>&1 | tee "$OUT/misaligned.log"
import torch, torch.nn.functional as F
import kernels.attention.window_triton as wt
from kernels.attention import attention
from kernels.attention.masks import SlidingWindow
torch.manual_seed(2)
st = torch.randn(2 * 4 * 640 * 64 + 1, device="cuda", dtype=torch.bfloat16)
mis = st[1:].view(2, 4, 640, 64); ali = mis.clone()
ref = attention(ali.float(), ali.float(), ali.float(), SlidingWindow(128), backend="math")
rel = lambda a: float((a.float() - ref).norm() / ref.norm())
cfg = wt.pointer_loads(wt.window_config(torch.device("cuda"), 64))
o_mis, _ = wt.launch_forward(mis, mis, mis, 128, 64 ** -0.5, cfg.fwd)
o_ali, _ = wt.launch_forward(ali, ali, ali, 128, 64 ** -0.5, cfg.fwd)
dense = SlidingWindow(128).dense(640, 640, device="cuda")
print("pointer-load forward, Triton's launch: misaligned base rel err", rel(o_mis), "| aligned", rel(o_ali))
print("SDPA with the dense window: misaligned", rel(F.scaled_dot_product_attention(mis, mis, mis, attn_mask=dense)),
      "| aligned", rel(F.scaled_dot_product_attention(ali, ali, ali, attn_mask=dense)))
print("attention(triton_window) on the misaligned view", rel(attention(mis, mis, mis, SlidingWindow(128))))
PY
timeout 80 python3 benchmarks/window_host_overhead.py --seq 8192 32768 > "$OUT/host.log" 2>&1
sed -n '/^window_host_overhead/,$p' "$OUT/host.log"
timeout 200 python3 benchmarks/attn_bench.py --seq 8192 32768 --variants stock --budget-s 150 \
  --json "$OUT/attn_bench.json" > "$OUT/attn_bench.log" 2>&1
sed -n '/^attn_bench /,$p' "$OUT/attn_bench.log"
