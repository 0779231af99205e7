#!/usr/bin/env bash
# One device call (lent H200): the class-major layout of the fused loss (logits held inside
# the weight gradient's buffer): its CUDA tests, its phases / tiles / slab sizes at N=4096,
# and the anchors at N=4096 timed round-robin. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_lce_cuda.py tests/kernels/test_lce_class_major.py \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/tests.log"
timeout 150 python3 benchmarks/lce_bench.py --class-major --n 4096 --reps 7 --json "$OUT/class_major.json" \
  > "$OUT/class_major.log" 2>&1
echo "sweep rc=$?"; grep -E "class-major|Error|error" "$OUT/class_major.log" | head -60
timeout 170 python3 benchmarks/lce_bench.py --device cuda --n 4096 --reps 9 --json "$OUT/lce_4096.json" > "$OUT/lce_4096.log" 2>&1
echo "anchors rc=$?"; sed -n '/^bf16/p;/^N=4096/,$p' "$OUT/lce_4096.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
