#!/usr/bin/env bash
# One device call (lent H200): forward shapes that fit three programs per SM (32-key tiles, less
# shared memory) in Gluon and Triton, against the shipped forward. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 benchmarks/window_gluon_bench.py --seq 32768 --json "$OUT/gluon.json" \
  --shapes 4/64/3 4/64/2 4/32/2 4/32/3 4/32/4 --chunked --ws \
  --triton-shapes 64x32/w4/s3/tma 64x32/w4/s4/tma 64x64/w4/s2/tma > "$OUT/gluon.log" 2>&1
echo "rc=$?"
grep -v '^\[' "$OUT/gluon.log" | tail -30
grep -i "Traceback\|Error" "$OUT/gluon.log" | head -5
