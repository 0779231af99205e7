#!/usr/bin/env bash
# One device call (lent H200): why window_static's GPU test failed in compile_checks.sh; the small
# model compiled in one graph on each attention path (flex's block-mask cache now traceable);
# whole training steps of the ~1B model with and without its transformer blocks compiled
# (torch.compile(block, fullgraph=True)), fused loss with the window kernel and with flex, at 8k
# then 32k. Logs and JSON under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 60 python3 benchmarks/window_static.py --dim 64 --kernels fwd dq --fwd-shapes 64x32/w4/s2 \
  --dq-shapes 64x32/w4/s2/tma 2>&1 | tee "$OUT/static.log" | grep -E "error|fwd |dq " | cut -c1-400 | head -4
timeout 100 python3 benchmarks/gpu/exp/compile_model.py 2>&1 | tee "$OUT/compile_model.log" | grep "^|"
timeout 200 python3 benchmarks/step_bench.py --seq 8192 --steps 3 --warmup 2 --budget-s 150 --compile-blocks \
  --configs fused+window_kernel fused+flex --json "$OUT/step_8k.json" 2>"$OUT/step_8k.err" | tee "$OUT/step_8k.log" | tail -6
timeout 180 python3 benchmarks/step_bench.py --seq 32768 --steps 2 --warmup 1 --budget-s 100 --compile-blocks \
  --configs fused+window_kernel fused+flex --json "$OUT/step_32k.json" 2>"$OUT/step_32k.err" | tee "$OUT/step_32k.log" | tail -6
