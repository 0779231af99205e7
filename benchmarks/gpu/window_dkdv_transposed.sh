#!/usr/bin/env bash
# One device call (lent H200): an experiment with the dK/dV kernel on transposed tiles (rejected:
# 1.347 vs 1.304 ms at D=128, 0.836 vs 0.627 ms at D=64; the kernel keeps its first form):
# GPU tests, then a block search weighted to dK/dV at the bench shape (32 x 128, with stock flex
# in the same run) and the model's (32/8 heads x 64). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_window_triton.py -k "gpu or cuda" \
  2>&1 | tee "$OUT/tests.log" | tail -1
timeout 230 python3 benchmarks/window_tune.py --budget-s 130 --json "$OUT/tune128.json" \
  --fwd-shapes 64x32/w4/s3 64x32/w4/s4 64x16/w4/s3 32x32/w4/s3 64x64/w4/s2 \
  --dq-shapes 64x32/w4/s2 64x32/w4/s3 64x16/w4/s2 32x32/w4/s2 64x64/w4/s2 \
  --dkdv-shapes 64x64/w4/s2 64x64/w4/s3 64x64/w8/s2 32x64/w4/s2 32x64/w4/s3 64x32/w4/s2 64x32/w4/s3 \
    128x32/w4/s2 128x32/w8/s2 32x128/w4/s2 32x128/w8/s2 32x128/w8/s3 64x128/w8/s2 128x64/w8/s2 16x64/w4/s2 \
    32x32/w4/s2 > "$OUT/tune128.log" 2>&1
tail -9 "$OUT/tune128.log"
timeout 100 python3 benchmarks/window_tune.py --dim 64 --heads 32 --kv-heads 8 --no-flex --kernels dkdv \
  --budget-s 50 --json "$OUT/tune64.json" --dkdv-shapes 64x64/w4/s2 64x64/w4/s3 32x64/w4/s2 64x32/w4/s2 \
  128x32/w4/s2 32x128/w4/s2 64x128/w4/s2 128x64/w8/s2 128x128/w8/s2 > "$OUT/tune64.log" 2>&1
tail -5 "$OUT/tune64.log"
