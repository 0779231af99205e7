#!/usr/bin/env bash
# One device call (lent H200): the fused loss's CUDA tests (with the float32-master-weight
# path under autocast), then whole 8k steps of the two fused configurations. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_lce_cuda.py 2>&1 | tee "$OUT/tests.log" | tail -2
timeout 120 python3 benchmarks/step_bench.py --seq 8192 --steps 3 --warmup 2 --budget-s 100 \
  --configs fused+window_kernel fused+flex --json "$OUT/step_8k.json" > "$OUT/step_8k.log" 2>&1
tail -4 "$OUT/step_8k.log"
