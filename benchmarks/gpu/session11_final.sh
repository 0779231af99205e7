#!/usr/bin/env bash
# One device call (lent H200, torch 2.11), on the eleventh session's final code: every test
# outside tests/kernels again (after the torch 2.11 fixes), then the fused loss's anchors at
# both N, round-robin, with Liger and Cut Cross-Entropy (carried wheels).
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 12 -rs tests --ignore=tests/kernels > "$OUT/suite.log" 2>&1
echo "suite rc=$?"; grep -E "passed|failed|FAILED|ERROR|SKIPPED" "$OUT/suite.log" | tail -30
timeout 260 python3 benchmarks/lce_bench.py --device cuda --reps 9 --json "$OUT/lce_cuda.json" > "$OUT/lce.log" 2>&1
echo "lce rc=$?"; grep -E "FAILED|ceiling" "$OUT/lce.log"; sed -n '/^N=4096/,$p' "$OUT/lce.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
