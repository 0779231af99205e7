#!/usr/bin/env bash
# One device call (lent H200): why the window forward measures ~0.50 ms alone and ~0.54 ms through
# attention() when queued (benchmarks/window_forward_gaps.py), then the 32k anchors row on this
# session's code. Logs and JSON under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 150 python3 benchmarks/window_forward_gaps.py --seq 32768 --rounds 3 2>&1 | tee "$OUT/gaps.log" | tail -6
timeout 200 python3 benchmarks/attn_bench.py --seq 32768 --variants stock --budget-s 120 \
  --json "$OUT/attn_bench.json" > "$OUT/attn_bench.log" 2>&1
sed -n '/^attn_bench /,$p' "$OUT/attn_bench.log" | head -14
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
