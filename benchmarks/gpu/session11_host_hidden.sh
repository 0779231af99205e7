#!/usr/bin/env bash
# One device call (lent H200): how much of the fused loss's N=16384 step is the GPU waiting for
# the host (benchmarks/gpu/exp/lce_host_hidden.py), and the per-kernel profile with idle gaps.
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
timeout 150 python3 benchmarks/gpu/exp/lce_host_hidden.py --reps 9 > "$OUT/hidden.log" 2>&1
echo "hidden rc=$?"; tail -5 "$OUT/hidden.log"
timeout 200 python3 benchmarks/lce_bench.py --profile --n 16384 --only "(triton, bf16 dW" "unfused torch.compile" \
  --json "$OUT/profile_16384.json" > "$OUT/profile_16384.log" 2>&1
echo "profile rc=$?"; grep -E "profile|ms  x|idle|Error" "$OUT/profile_16384.log" | head -40
