#!/usr/bin/env bash
# One device call (lent H200): programmatic dependent launch against the shipped window kernels in
# alternating rounds; then where the fused loss's time goes at N=4096 (GPU busy vs wall per step,
# per-kernel totals) for compile and both dW accumulations. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 benchmarks/gpu/exp/pdl_ab.py 2>&1 | tee "$OUT/pdl_ab.log" | grep -v "^\[" | tail -14
timeout 240 python3 benchmarks/lce_bench.py --profile --n 4096 --only "torch.compile" "fp32 dW" "bf16 dW" 2>&1 \
  | tee "$OUT/lce_profile.log" | grep -E "profile N=|ms  x" | head -40
