#!/usr/bin/env bash
# One device call (lent H200): the window kernel's host time per call (TMA against pointer loads),
# then whole training steps of the ~1B model, every configuration, at 8k and 32k tokens
# (benchmarks/step_bench.py). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 60 python3 benchmarks/window_host_overhead.py > "$OUT/host.log" 2>&1
sed -n '/^window_host_overhead/,$p' "$OUT/host.log"
timeout 60 python3 benchmarks/window_host_overhead.py --dim 64 --seq 8192 > "$OUT/host64.log" 2>&1
sed -n '/^window_host_overhead/,$p' "$OUT/host64.log"
timeout 190 python3 benchmarks/step_bench.py --seq 8192 --steps 3 --warmup 2 --budget-s 160 \
  --configs fused+window_kernel fused+flex flex fused_loss baseline causal_flash \
  --json "$OUT/step_8k.json" > "$OUT/step_8k.log" 2>&1
tail -9 "$OUT/step_8k.log"
timeout 230 python3 benchmarks/step_bench.py --seq 32768 --steps 2 --warmup 1 --budget-s 200 \
  --configs fused+window_kernel fused+flex flex fused_loss baseline causal_flash \
  --json "$OUT/step_32k.json" > "$OUT/step_32k.log" 2>&1
tail -9 "$OUT/step_32k.log"
