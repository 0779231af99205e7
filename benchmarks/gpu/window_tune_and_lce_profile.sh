#!/usr/bin/env bash
# One device call (lent H200): the window kernel's GPU test, its block search at the bench shape
# (32 heads x 128) and the model's (32/8 heads x 64), and where the fused loss spends its time.
# Usage on the device: bash benchmarks/gpu/window_tune_and_lce_profile.sh   (logs under $OUT)
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_window_triton.py 2>&1 | tee "$OUT/tests.log" | tail -3
timeout 230 python3 benchmarks/window_tune.py --budget-s 150 --json "$OUT/tune128.json" > "$OUT/tune128.log" 2>&1
tail -9 "$OUT/tune128.log"
timeout 130 python3 benchmarks/window_tune.py --dim 64 --heads 32 --kv-heads 8 --no-flex --budget-s 90 \
  --json "$OUT/tune64.json" > "$OUT/tune64.log" 2>&1
tail -7 "$OUT/tune64.log"
timeout 100 python3 benchmarks/lce_bench.py --profile --n 16384 --only "torch.compile" "bf16 dW" \
  > "$OUT/lce_profile.log" 2>&1
tail -24 "$OUT/lce_profile.log"
