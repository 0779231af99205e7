#!/usr/bin/env bash
# One device call (lent H200): the fused loss against its anchors at both N, timed round-robin
# (benchmarks/lce_bench.py). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 300 python3 benchmarks/lce_bench.py --device cuda --reps 11 --json "$OUT/lce_cuda.json" > "$OUT/lce.log" 2>&1
sed -n '/^bf16/p;/^N=4096/,$p' "$OUT/lce.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
