#!/usr/bin/env bash
# One device call (lent H200), run 2026-12-01 08:40-08:45 UTC with a rule since reverted (pointer loads
# below 2^20 query rows, TMA above): the window kernel's GPU tests, host time per call, the
# attention bench at 8k and 32k, and whole 8k training steps of the window kernel against flex.
# Its 8k host-time rows contradicted the previous call's (host-bound, +-0.2 ms), so the rule went
# and TMA is used wherever the GPU has it; its 32k rows ran the shipped code. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_window_triton.py \
  tests/kernels/test_attention.py 2>&1 | tee "$OUT/tests.log" | tail -1
timeout 60 python3 benchmarks/window_host_overhead.py --seq 8192 32768 > "$OUT/host.log" 2>&1
sed -n '/^window_host_overhead/,$p' "$OUT/host.log"
timeout 170 python3 benchmarks/attn_bench.py --variants stock --seq 8192 32768 --budget-s 140 \
  --json "$OUT/attn_bench.json" > "$OUT/attn_bench.log" 2>&1
sed -n '/^attn_bench /,$p' "$OUT/attn_bench.log"
timeout 130 python3 benchmarks/step_bench.py --seq 8192 --steps 3 --warmup 2 --budget-s 110 \
  --configs fused+window_kernel fused+flex --json "$OUT/step_8k.json" > "$OUT/step_8k.log" 2>&1
tail -4 "$OUT/step_8k.log"
