#!/usr/bin/env bash
# One device call (lent H200): the class-major sweep at N=4096 (phases with the one-exponential
# column pass), then per-kernel GPU time of one fwd+bwd: our default route against unfused
# torch.compile at N=4096, and the bf16-dW route eagerly and under torch.compile at N=16384
# (the compiled one has measured ~2.5 ms faster in two round-robin runs). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 150 python3 benchmarks/lce_bench.py --class-major --n 4096 --reps 7 --json "$OUT/class_major.json" \
  > "$OUT/class_major.log" 2>&1
echo "sweep rc=$?"; grep -E "class-major|Error|error" "$OUT/class_major.log" | head -60
timeout 150 python3 benchmarks/lce_bench.py --profile --n 4096 --only "fp32 dW" "unfused torch.compile" \
  --json "$OUT/profile_4096.json" > "$OUT/profile_4096.log" 2>&1
echo "profile 4096 rc=$?"; grep -E "profile|ms  x" "$OUT/profile_4096.log" | head -40
timeout 200 python3 benchmarks/lce_bench.py --profile --n 16384 --only "bf16 dW" \
  --json "$OUT/profile_16384.json" > "$OUT/profile_16384.log" 2>&1
echo "profile 16384 rc=$?"; grep -E "profile|ms  x" "$OUT/profile_16384.log" | head -40
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
