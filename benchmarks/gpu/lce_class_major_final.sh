#!/usr/bin/env bash
# One device call (lent H200): every CUDA test of the fused loss, the column kernels' launch
# shapes each on its own (N=4096), and the anchors at both N, round-robin. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_lce_cuda.py tests/kernels/test_lce_class_major.py \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$OUT/tests.log"
timeout 120 python3 benchmarks/lce_bench.py --class-major --n 4096 --reps 7 --json "$OUT/class_major.json" \
  > "$OUT/class_major.log" 2>&1
echo "sweep rc=$?"; grep -E "column|whole|Error|error" "$OUT/class_major.log" | head -60
timeout 260 python3 benchmarks/lce_bench.py --device cuda --reps 11 --json "$OUT/lce_cuda.json" > "$OUT/lce.log" 2>&1
echo "anchors rc=$?"; sed -n '/^bf16/p;/^N=4096/,$p' "$OUT/lce.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
