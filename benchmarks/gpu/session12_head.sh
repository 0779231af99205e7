#!/usr/bin/env bash
# One device call (lent H200, torch 2.11): the fused loss's CUDA tests with the class-major
# head, then its A/B at N=16384 (benchmarks/gpu/exp/class_major_head.py). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 6 tests/kernels/test_lce_cuda.py tests/kernels/test_lce_class_major.py tests/kernels/test_lce.py > "$OUT/lce_tests.log" 2>&1
echo "lce tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/lce_tests.log" | tail -12
timeout 300 python3 benchmarks/gpu/exp/class_major_head.py --reps 9 > "$OUT/head.log" 2>&1
echo "head rc=$?"; tail -12 "$OUT/head.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
