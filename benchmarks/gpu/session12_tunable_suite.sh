#!/usr/bin/env bash
# One device call (lent H200, torch 2.11): TunableOp on the fused loss's chunk products
# (benchmarks/gpu/exp/dw_tunableop.py), every test outside tests/kernels on this session's
# fixes (launcher, heartbeat deregistration, watchdog), then N=16384 re-timed with more steps.
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
PYTORCH_TUNABLEOP_VERBOSE=3 timeout 200 python3 benchmarks/gpu/exp/dw_tunableop.py --rounds 7 > "$OUT/tunable.log" 2>&1
echo "tunable rc=$?"; grep -ciE "solution|candidate" "$OUT/tunable.log"; sed -n '/TunableOp results/,$p' "$OUT/tunable.log" | tail -20
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 12 -rs tests --ignore=tests/kernels > "$OUT/suite.log" 2>&1
echo "suite rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -10
timeout 150 python3 benchmarks/lce_bench.py --device cuda --n 16384 --reps 15 --only "torch.compile" "bf16" "Liger" > "$OUT/lce16k.log" 2>&1
echo "lce rc=$?"; grep -E "ceiling" "$OUT/lce16k.log" | head -1; sed -n '/^| implementation/,$p' "$OUT/lce16k.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
