#!/usr/bin/env bash
# One device call (lent H200), sixth session's final code (dK/dV on transposed tiles by default):
# every kernels test on the GPU, the attention bench at 32k against stock flex and SDPA, and whole
# 8k training steps of the ~1B model (window kernel vs flex, both with the fused loss). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels 2>&1 | tee "$OUT/tests.log" | tail -2
timeout 150 python3 benchmarks/attn_bench.py --variants stock --seq 32768 --budget-s 100 \
  --json "$OUT/attn_bench.json" > "$OUT/attn_bench.log" 2>&1
sed -n '/^attn_bench /,$p' "$OUT/attn_bench.log"
timeout 120 python3 benchmarks/step_bench.py --seq 8192 --steps 3 --warmup 2 --budget-s 90 \
  --configs fused+window_kernel fused+flex --json "$OUT/step_8k.json" > "$OUT/step_8k.log" 2>&1
tail -5 "$OUT/step_8k.log"
