#!/usr/bin/env bash
# One device call (lent H200): the Gluon forward with several query blocks per program and a
# key/value ring (each tile loaded once per program), checked and timed against the shipped
# Triton forward and the one-block Gluon forward. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 400 python3 benchmarks/window_gluon_bench.py --seq 32768 8192 --json "$OUT/gluon.json" --shapes 4/64/3 \
  --chunked 4/64/0/0 4/64/0/4 4/64/6/3 4/64/0/8 4/64/0/32 > "$OUT/gluon.log" 2>&1
echo "rc=$?"
grep -v '^\[' "$OUT/gluon.log" | tail -40
grep -i "error\|Traceback" "$OUT/gluon.log" | head -5
