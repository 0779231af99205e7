#!/usr/bin/env bash
# One device call (lent H200), on the shipped code: the fused loss's CUDA tests and the model's
# (it calls the fused loss), then the anchors at both N, round-robin. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_lce_cuda.py tests/kernels/test_lce_class_major.py \
  tests/kernels/test_model.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$OUT/tests.log"
timeout 260 python3 benchmarks/lce_bench.py --device cuda --reps 11 --json "$OUT/lce_cuda.json" > "$OUT/lce.log" 2>&1
echo "anchors rc=$?"; sed -n '/^bf16/p;/^N=4096/,$p' "$OUT/lce.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
