#!/usr/bin/env bash
# One device call (lent H200): the Gluon forward with the query tile in registers (the score
# products then read only K from shared memory) against the shipped Triton forward. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 400 python3 benchmarks/window_gluon_bench.py --seq 32768 8192 --json "$OUT/gluon.json" \
  --shapes 4/64/3 4/64/3/q 4/64/2/q 4/64/4/q 8/64/2/q --chunked > "$OUT/gluon.log" 2>&1
echo "rc=$?"
grep -v '^\[' "$OUT/gluon.log" | tail -40
