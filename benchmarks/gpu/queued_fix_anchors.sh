#!/usr/bin/env bash
# One device call (lent H200): the 32k anchors after attn_bench's queued regions open behind a
# call already in flight (before, each region counted its first call's launch). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 benchmarks/attn_bench.py --seq 32768 --variants stock --budget-s 120 \
  --json "$OUT/attn_bench.json" > "$OUT/attn_bench.log" 2>&1
sed -n '/^attn_bench /,$p' "$OUT/attn_bench.log" | head -12
