#!/usr/bin/env bash
# One device call (lent H200): the window kernel against SDPA at every head dim it takes (16, 32
# and 256 run the nearest shipped shapes; the GPU tests covered 64 and 128 only), then the 8k
# anchors row after attn_bench's timing loops were folded into one region_ms. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_window_triton.py -k "matches_sdpa" \
  2>&1 | tee "$OUT/tests.log" | tail -3
timeout 150 python3 benchmarks/attn_bench.py --seq 8192 --variants stock --budget-s 80 \
  --json "$OUT/attn_bench.json" > "$OUT/attn_bench.log" 2>&1
sed -n '/^attn_bench /,$p' "$OUT/attn_bench.log" | head -12
