#!/usr/bin/env bash
# Claim: fused linear + cross-entropy (V=128256, H=4096, bf16, N=4096 and 16384) against
# torch.compile, Liger and Cut Cross-Entropy (carried wheels), round-robin in one process.
# The fused loss's CUDA tests first. One device call; logs and JSON under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_lce_cuda.py tests/kernels/test_lce_class_major.py \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$OUT/tests.log"
timeout 300 python3 benchmarks/lce_bench.py --device cuda --reps 9 --json "$OUT/lce_cuda.json" > "$OUT/lce.log" 2>&1
rc=$?
echo "lce_bench rc=$rc"; sed -n '/^bf16/p;/^N=4096/,$p' "$OUT/lce.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
exit $rc
