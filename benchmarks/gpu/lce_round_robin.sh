#!/usr/bin/env bash
# One device call (lent H200): the fused loss against its anchors at both N, timed round-robin
# (benchmarks/lce_bench.py). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 300 python3 benchmarks/lce_bench.py --device cuda --reps 11 --json "$OUT/lce_cuda.json" > "$OUT/lce.log" 2>&1
sed -n '/^bf16/p;/^N=4096/,$p' "$OUT/lce.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
