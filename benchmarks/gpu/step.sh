#!/usr/bin/env bash
# Claim: whole training step of the ~1B model (fused loss + window attention, transformer
# blocks compiled) against the same step with flex_attention, at 8k then 32k tokens; MFU
# against the bf16 ceiling measured in the same run. One device call; logs and JSON under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 220 python3 benchmarks/step_bench.py --seq 8192 --steps 3 --warmup 2 --budget-s 150 --compile-blocks \
  --configs fused+window_kernel fused+flex --json "$OUT/step_8k.json" 2>"$OUT/step_8k.err" | tee "$OUT/step_8k.log" | tail -6
timeout 300 python3 benchmarks/step_bench.py --seq 32768 --steps 2 --warmup 1 --budget-s 150 --compile-blocks \
  --configs fused+window_kernel fused+flex --json "$OUT/step_32k.json" 2>"$OUT/step_32k.err" | tee "$OUT/step_32k.log" | tail -6
