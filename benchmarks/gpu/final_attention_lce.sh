#!/usr/bin/env bash
# One device call (lent H200): every kernels test (the window kernel's forms on the GPU, run-to-run
# bit-identical backward, the fused loss's CUDA tests), the attention bench against its anchors
# (stock flex, SDPA causal/dense, varlen; one call and queued timings) at 8k/32k/131k, and the
# fused loss against its anchors at N=4096 and 16384 (Liger and CCE carried as wheels). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels 2>&1 | tee "$OUT/tests.log" | tail -2
timeout 240 python3 benchmarks/attn_bench.py --variants stock --budget-s 200 --json "$OUT/attn_bench.json" \
  > "$OUT/attn_bench.log" 2>&1
sed -n '/^attn_bench /,$p' "$OUT/attn_bench.log"
timeout 190 python3 benchmarks/lce_bench.py --device cuda --reps 7 --json "$OUT/lce_cuda.json" > "$OUT/lce.log" 2>&1
sed -n '/^bf16/p;/^N=4096/,$p' "$OUT/lce.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
