#!/usr/bin/env bash
# One device call (lent H200): the warp-specialised Gluon forward (a producer warp streams the
# tiles of several query blocks; the warpgroup only waits on barriers and multiplies) against the
# shipped Triton forward and the one-block Gluon forward. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 benchmarks/window_gluon_bench.py --seq 32768 8192 --json "$OUT/gluon.json" --shapes 4/64/3 \
  --chunked --ws 3/1/0 3/1/1 3/1/8 2/2/0 2/1/0 > "$OUT/gluon.log" 2>&1
echo "rc=$?"
grep -v '^\[' "$OUT/gluon.log" | tail -40
grep -i "Traceback\|Error" "$OUT/gluon.log" | head -5
