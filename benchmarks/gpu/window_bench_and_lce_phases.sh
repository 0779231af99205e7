#!/usr/bin/env bash
# One device call (lent H200): GPU tests of both kernels, the fused loss's phases (dW layouts,
# device-side gradient scaling), attn_bench with the tuned window kernel against stock flex and
# SDPA at 8k/32k/131k, and whole training steps with flex vs the window kernel. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 100 python3 -m pytest -q -p no:cacheprovider -x tests/kernels/test_lce_cuda.py \
  tests/kernels/test_attention_window_triton.py -k "not interpreter" 2>&1 | tee "$OUT/tests.log" | tail -2
timeout 70 python3 benchmarks/lce_bench.py --sweep --n 16384 --chunks 1024 --accum bfloat16 --reps 5 \
  > "$OUT/lce_phases.log" 2>&1
grep -E "sweep|phase" "$OUT/lce_phases.log"
timeout 210 python3 benchmarks/attn_bench.py --variants stock --budget-s 170 --json "$OUT/attn_bench.json" \
  > "$OUT/attn_bench.log" 2>&1
sed -n '/^attn_bench /,$p' "$OUT/attn_bench.log"
timeout 160 python3 benchmarks/step_bench.py --configs fused+flex fused+window_kernel --steps 3 --warmup 2 \
  --budget-s 120 --json "$OUT/step_bench.json" > "$OUT/step_bench.log" 2>&1
tail -8 "$OUT/step_bench.log"
