#!/usr/bin/env bash
# One device call (lent H200, torch 2.11): Triton persistent TMA kernels for the fused loss's
# accumulating dW product against cuBLAS (benchmarks/gpu/exp/dw_triton.py), then every test
# outside tests/kernels again (after the start-line fix of the 2 s communicator tests).
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
timeout 300 python3 benchmarks/gpu/exp/dw_triton.py --rounds 7 > "$OUT/dw_triton.log" 2>&1
echo "dw_triton rc=$?"; grep -v "^  \|^Traceback" "$OUT/dw_triton.log" | tail -40
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 12 -rs tests --ignore=tests/kernels > "$OUT/suite.log" 2>&1
echo "suite rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -10
