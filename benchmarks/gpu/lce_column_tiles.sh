#!/usr/bin/env bash
# One device call (lent H200): the class-major sweep at N=4096 (products per layout, the column
# kernels' launch shapes each on its own, whole calls per slab size). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 150 python3 benchmarks/lce_bench.py --class-major --n 4096 --reps 7 --json "$OUT/class_major.json" \
  > "$OUT/class_major.log" 2>&1
echo "sweep rc=$?"; grep -E "class-major|Error|error" "$OUT/class_major.log" | head -80
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
