#!/usr/bin/env bash
# One device call (lent H200): the window kernel's GPU test, its block search at the bench shape
# (32 heads x 128) and the model's (32/8 heads x 64), and where the fused loss spends its time.
# Usage on the device: bash benchmarks/gpu/window_tune_and_lce_profile.sh   (logs under $OUT)
source "$(dirname "$0")/prelude.sh"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_window_triton.py 2>&1 | tee "$OUT/tests.log" | tail -3
timeout 230 python3 benchmarks/window_tune.py --budget-s 150 --json "$OUT/tune128.json" > "$OUT/tune128.log" 2>&1
tail -9 "$OUT/tune128.log"
timeout 130 python3 benchmarks/window_tune.py --dim 64 --heads 32 --kv-heads 8 --no-flex --budget-s 90 \
  --json "$OUT/tune64.json" > "$OUT/tune64.log" 2>&1
tail -7 "$OUT/tune64.log"
timeout 100 python3 benchmarks/lce_bench.py --profile --n 16384 --only "torch.compile" "bf16 dW" \
  > "$OUT/lce_profile.log" 2>&1
tail -24 "$OUT/lce_profile.log"
