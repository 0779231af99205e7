#!/usr/bin/env bash
# One device call (lent H200): the fused loss at N=16384 once more (round-robin with compile and
# Liger, the wheels carried), then per-kernel GPU time of our bf16-gradient route and compile.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 benchmarks/lce_bench.py --device cuda --n 16384 --reps 9 \
  --only "torch.compile" "triton, bf16" "fp32 dW" "Liger" --json "$OUT/lce_cuda.json" > "$OUT/lce.log" 2>&1
echo "lce rc=$?"; grep -E "FAILED" "$OUT/lce.log"; sed -n '/^N=16384/,$p' "$OUT/lce.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 200 python3 benchmarks/lce_bench.py --profile --n 16384 --only "(triton, bf16 dW" "unfused torch.compile" \
  --json "$OUT/profile_16384.json" > "$OUT/profile_16384.log" 2>&1
echo "profile rc=$?"; grep -E "profile|ms  x|idle|Error" "$OUT/profile_16384.log" | head -50
