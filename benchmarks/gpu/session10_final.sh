#!/usr/bin/env bash
# One device call (lent H200), on the tenth session's code: every kernels test (the compiled
# block-mask builder changed), the window kernel vs stock flex at 32k with mask creation times,
# and the fused loss at N=16384 (the bf16-gradient route against compile and Liger), round-robin.
source "$(dirname "$0")/prelude.sh"
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -1 "$OUT/tests.log"
timeout 150 python3 benchmarks/attn_bench.py --seq 32768 --variants stock --budget-s 90 \
  --json "$OUT/attn.json" > "$OUT/attn.log" 2>&1
echo "attn rc=$?"; tail -25 "$OUT/attn.log"
timeout 170 python3 benchmarks/lce_bench.py --device cuda --n 16384 --reps 9 \
  --only "torch.compile" "triton, bf16" "fp32 dW" "Liger" --json "$OUT/lce_cuda.json" > "$OUT/lce.log" 2>&1
echo "lce rc=$?"; sed -n '/^bf16/p;/^N=16384/,$p' "$OUT/lce.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
