#!/usr/bin/env bash
# One device call (lent H200): per-kernel GPU time and the GPU's idle gaps of one fwd+bwd at
# N=4096: our default (class-major) route, the same call in one 4096-row chunk, and unfused
# torch.compile. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 benchmarks/lce_bench.py --profile --n 4096 --only "fp32 dW" "4096-row" "unfused torch.compile" \
  --json "$OUT/profile_4096.json" > "$OUT/profile_4096.log" 2>&1
echo "profile rc=$?"; grep -E "profile|ms  x|idle|Error" "$OUT/profile_4096.log" | head -60
