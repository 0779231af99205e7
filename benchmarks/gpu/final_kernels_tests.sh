#!/usr/bin/env bash
# One device call (lent H200): every kernels test on the final code (the SDPA misaligned-view test
# among them), then a third sample of the host-bound 8k attention row. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels 2>&1 | tee "$OUT/tests.log" | tail -2
grep -E "misaligned|direct" "$OUT/tests.log" | head
timeout 120 python3 benchmarks/attn_bench.py --seq 8192 --variants stock --budget-s 80 \
  --json "$OUT/attn_bench.json" > "$OUT/attn_bench.log" 2>&1
sed -n '/^attn_bench /,$p' "$OUT/attn_bench.log"
