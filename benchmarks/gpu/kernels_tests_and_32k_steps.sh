#!/usr/bin/env bash
# One device call (lent H200): every kernels test (window_static's ptxas fix and flex inside a
# caller's compile among them; the previous call's 240 s ran out at half the suite), then the
# 32k steps with compiled blocks after the window path's contiguity fix. Logs and JSON under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 270 python3 -m pytest -q -p no:cacheprovider -n 6 --durations=8 tests/kernels 2>&1 | tee "$OUT/tests.log" | tail -14
timeout 240 python3 benchmarks/step_bench.py --seq 32768 --steps 2 --warmup 1 --budget-s 150 --compile-blocks \
  --configs fused+window_kernel fused+flex --json "$OUT/step_32k.json" 2>"$OUT/step_32k.err" | tee "$OUT/step_32k.log" | tail -6
