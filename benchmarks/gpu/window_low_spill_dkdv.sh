#!/usr/bin/env bash
# One device call (lent H200), not yet run: the dK/dV shapes that benchmarks/window_static.py
# shows spilling least (no GPU needed to read that) and that the first search never reached,
# against the shipped 64x64/w4/s2 (1.2 KB spilled per thread at head dim 128), with stock flex
# in the same run; then the model's head dim. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
SHAPES="64x64/w4/s2 64x32/w4/s2 64x32/w4/s3 64x16/w4/s2 32x32/w4/s2 128x32/w8/s2 128x64/w8/s2"
timeout 240 python3 benchmarks/window_tune.py --kernels dkdv --budget-s 120 --json "$OUT/dkdv128.json" \
  --dkdv-shapes $SHAPES > "$OUT/dkdv128.log" 2>&1
tail -6 "$OUT/dkdv128.log"
timeout 150 python3 benchmarks/window_tune.py --kernels dkdv --dim 64 --heads 32 --kv-heads 8 --no-flex \
  --budget-s 90 --json "$OUT/dkdv64.json" --dkdv-shapes $SHAPES > "$OUT/dkdv64.log" 2>&1
tail -5 "$OUT/dkdv64.log"
