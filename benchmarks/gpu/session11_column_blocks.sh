#!/usr/bin/env bash
# One device call (lent H200): the fused loss's GPU tests with the accumulating dW products made
# in column blocks (tests/kernels/test_lce_cuda.py), then the A/B at N=16384 against compile
# (benchmarks/gpu/exp/dw_column_blocks.py), twice.
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_lce_cuda.py tests/kernels/test_lce.py \
  > "$OUT/lce_tests.log" 2>&1
echo "lce tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/lce_tests.log" | tail -12
for i in 1 2; do
  timeout 150 python3 benchmarks/gpu/exp/dw_column_blocks.py --reps 9 > "$OUT/ab$i.log" 2>&1
  echo "ab$i rc=$?"; tail -9 "$OUT/ab$i.log"
done
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
