#!/usr/bin/env bash
# One device call (lent H200): launch shapes of the transposed dK/dV kernel and of dQ from its
# key-major dS tiles, at 32x128 and 32/8x64 (S=32768, window 256), queued. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 110 python3 benchmarks/window_tune.py --no-flex --budget-s 70 --json "$OUT/tune128.json" --kernels dkdv dqds \
  --dkdv-shapes 64x64/w4/s2/tma 64x64/w4/s3/tma 64x32/w4/s2/tma 32x64/w4/s2/tma 64x64/w8/s2/tma \
  --dqds-shapes 0x0/w4/s4/tma 0x0/w4/s3/tma 0x0/w8/s3/tma > "$OUT/tune128.log" 2>&1
grep "\[row\]" "$OUT/tune128.log" | cut -c1-160; sed -n '/^window_tune /,$p' "$OUT/tune128.log" | tail -8
timeout 80 python3 benchmarks/window_tune.py --dim 64 --kv-heads 8 --no-flex --budget-s 45 --json "$OUT/tune64.json" \
  --kernels dkdv --dkdv-shapes 64x64/w4/s3/tma 64x64/w4/s2/tma 64x64/w4/s4/tma 128x64/w8/s2/tma > "$OUT/tune64.log" 2>&1
grep "\[row\]" "$OUT/tune64.log" | cut -c1-160; sed -n '/^window_tune /,$p' "$OUT/tune64.log" | tail -8
