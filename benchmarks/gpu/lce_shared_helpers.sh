#!/usr/bin/env bash
# One device call (lent H200) after the row and column kernels began sharing their math: the
# fused loss's CUDA tests, the class-major phases (column and row passes re-timed) and the
# anchors at both N, round-robin. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_lce_cuda.py tests/kernels/test_lce_class_major.py \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$OUT/tests.log"
timeout 100 python3 benchmarks/lce_bench.py --class-major --n 4096 --reps 7 --json "$OUT/class_major.json" \
  > "$OUT/class_major.log" 2>&1
echo "sweep rc=$?"; grep -E "row kernel|column stats 64x16/w4 32|grad 256x16/w8 8/|whole|Error" "$OUT/class_major.log"
timeout 200 python3 benchmarks/lce_bench.py --device cuda --reps 11 --json "$OUT/lce_cuda.json" > "$OUT/lce.log" 2>&1
echo "anchors rc=$?"; sed -n '/^bf16/p;/^N=4096/,$p' "$OUT/lce.log"
