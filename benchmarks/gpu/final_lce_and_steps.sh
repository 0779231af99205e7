#!/usr/bin/env bash
# One device call (lent H200): the fused loss against its anchors (both N, one run), and whole
# training steps of every configuration at 8k and 32k (one run each). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 benchmarks/lce_bench.py --device cuda --reps 7 --json "$OUT/lce_cuda.json" > "$OUT/lce.log" 2>&1
sed -n '/^N=4096/,$p' "$OUT/lce.log"
timeout 170 python3 benchmarks/step_bench.py --seq 8192 --steps 3 --warmup 2 --budget-s 140 \
  --configs fused+window_kernel fused+flex flex fused_loss baseline causal_flash \
  --json "$OUT/step_8k.json" > "$OUT/step_8k.log" 2>&1
tail -9 "$OUT/step_8k.log"
timeout 190 python3 benchmarks/step_bench.py --seq 32768 --steps 2 --warmup 1 --budget-s 160 \
  --configs fused+window_kernel fused+flex flex fused_loss baseline causal_flash \
  --json "$OUT/step_32k.json" > "$OUT/step_32k.log" 2>&1
tail -9 "$OUT/step_32k.log"
