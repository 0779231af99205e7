#!/usr/bin/env bash
# One device call (lent H200): each window forward+backward call's host time (mean, median, tail),
# garbage collector on and off, at 8k and 32k. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 100 python3 benchmarks/window_profile.py --seq 8192 32768 --no-variants --distribution --cprofile-calls 5 \
  > "$OUT/distribution.log" 2>&1
grep -A5 "^f+b host us per call" "$OUT/distribution.log"; tail -4 "$OUT/distribution.log"
