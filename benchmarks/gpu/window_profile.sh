#!/usr/bin/env bash
# One device call (lent H200): where the window kernel's forward+backward spends GPU and host
# time, at the bench shape (32 x 128) and the model's (32/8 heads x 64). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 benchmarks/window_profile.py --seq 8192 32768 > "$OUT/profile128.log" 2>&1
cat "$OUT/profile128.log" | grep -v "^\s*$" | head -150
timeout 120 python3 benchmarks/window_profile.py --dim 64 --kv-heads 8 --seq 8192 --cprofile-calls 20 \
  > "$OUT/profile64.log" 2>&1
sed -n '/^=== /,/^cProfile/p' "$OUT/profile64.log" | grep -v "^\s*$" | head -60
tail -4 "$OUT/profile64.log"
