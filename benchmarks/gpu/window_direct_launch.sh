#!/usr/bin/env bash
# One device call (lent H200): the kernels tests (direct launches, misaligned inputs, every window
# kernel form, the fused loss's CUDA tests), the host's time per call with direct launches, and the
# attention bench against stock flex / SDPA at 8k, 32k, 131k (single and queued timings). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels 2>&1 | tee "$OUT/tests.log" | tail -2
timeout 90 python3 benchmarks/window_profile.py --seq 8192 32768 --cprofile-calls 10 > "$OUT/profile.log" 2>&1
grep -B2 -A12 "^host step" "$OUT/profile.log" | grep -v "^\s*$"; tail -4 "$OUT/profile.log"
timeout 260 python3 benchmarks/attn_bench.py --variants stock --budget-s 200 --json "$OUT/attn_bench.json" \
  > "$OUT/attn_bench.log" 2>&1
sed -n '/^attn_bench /,$p' "$OUT/attn_bench.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
