#!/usr/bin/env bash
# One device call (lent H200, torch 2.11): every kernels test on the twelfth session's final
# code, then one smoke round of the dW experiments after their shared helpers moved to
# benchmarks/gpu/exp/common.py. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
timeout 330 python3 -m pytest -q -p no:cacheprovider -n 6 -rs tests/kernels > "$OUT/kernels.log" 2>&1
echo "kernels rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/kernels.log" | tail -12
timeout 100 python3 benchmarks/gpu/exp/dw_accumulate.py --rounds 1 --reps 2 > "$OUT/smoke_acc.log" 2>&1; echo "dw_accumulate rc=$?"; tail -4 "$OUT/smoke_acc.log"
timeout 100 python3 benchmarks/gpu/exp/product_splits.py --rounds 1 --reps 2 > "$OUT/smoke_splits.log" 2>&1; echo "product_splits rc=$?"; tail -3 "$OUT/smoke_splits.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
