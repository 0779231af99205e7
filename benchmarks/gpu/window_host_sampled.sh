#!/usr/bin/env bash
# One device call (lent H200): where the host's time per window forward+backward goes, by sampling
# every thread's stack (the calling and the autograd thread) at 8k and 32k. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 120 python3 benchmarks/window_profile.py --seq 8192 32768 --no-variants --sample --cprofile-calls 5 \
  > "$OUT/sampled.log" 2>&1
sed -n '/^host stacks sampled/,/^$/p' "$OUT/sampled.log" | head -90; tail -4 "$OUT/sampled.log"
