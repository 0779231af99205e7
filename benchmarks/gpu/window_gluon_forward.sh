#!/usr/bin/env bash
# One device call (lent H200): the Gluon forward (softmax overlapped with P·V) checked and timed
# against the shipped Triton forward, at 32k (32x128 and 32/8x64) and 8k. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 400 python3 benchmarks/window_gluon_bench.py --seq 32768 8192 --json "$OUT/gluon.json" > "$OUT/gluon.log" 2>&1
echo "rc=$?"
grep -v '^\[' "$OUT/gluon.log" | tail -40
