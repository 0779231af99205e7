#!/usr/bin/env bash
# Claim: causal sliding-window attention (32k tokens, window 256, 32 heads x 128, bf16), the
# window kernel against stock compiled flex_attention and SDPA, single calls and queued.
# One device call; log and JSON under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 400 python3 benchmarks/attn_bench.py --seq 32768 --variants stock --budget-s 90 \
  --json "$OUT/attn_bench.json" > "$OUT/attn.log" 2>&1
rc=$?
echo "attn_bench rc=$rc"; sed -n '/^attn_bench /,$p' "$OUT/attn.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
exit $rc
