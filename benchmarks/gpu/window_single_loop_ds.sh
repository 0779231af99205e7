#!/usr/bin/env bash
# One device call (lent H200): the window kernels rewritten as one software-pipelined loop per
# program (edge tiles masked inside it) and the dQ-from-stored-dS backward, against the previous
# version of the module (carried in .exp/, not committed) and stock flex in the same run; a block
# search at the bench shape (32 x 128) and the model's (32/8 heads x 64); then where the fused
# loss spends its time at N=4096. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_window_triton.py -k "gpu or cuda" \
  2>&1 | tee "$OUT/tests.log" | tail -1
timeout 260 python3 benchmarks/window_tune.py --budget-s 170 --baseline .exp/window_triton_v1.py \
  --json "$OUT/tune128.json" \
  --fwd-shapes 64x32/w4/s2 64x32/w4/s3 64x32/w4/s4 64x64/w4/s2 64x64/w4/s3 128x64/w8/s2 128x32/w8/s3 \
  --dkdv-shapes 64x64/w4/s2 64x64/w4/s3 64x64/w8/s2 64x64/w8/s3 128x64/w8/s2 64x128/w8/s2 \
  --dq-shapes 64x32/w4/s2 64x32/w4/s3 64x64/w4/s2 > "$OUT/tune128.log" 2>&1
sed -n '/^window_tune /,$p' "$OUT/tune128.log"
timeout 110 python3 benchmarks/window_tune.py --dim 64 --heads 32 --kv-heads 8 --seq 32768 --no-flex --budget-s 70 \
  --baseline .exp/window_triton_v1.py --json "$OUT/tune64.json" \
  --fwd-shapes 64x32/w4/s2 64x32/w4/s3 64x64/w4/s2 64x64/w4/s3 128x64/w8/s2 \
  --dkdv-shapes 64x64/w4/s2 64x64/w4/s3 64x64/w8/s2 128x64/w8/s2 64x128/w8/s2 \
  --dq-shapes 64x32/w4/s2 64x32/w4/s3 64x64/w4/s2 > "$OUT/tune64.log" 2>&1
sed -n '/^window_tune /,$p' "$OUT/tune64.log"
timeout 100 python3 benchmarks/lce_bench.py --profile --n 4096 --only "torch.compile" "fp32 dW" "bf16 dW" \
  > "$OUT/lce_profile.log" 2>&1
grep -A 11 "profile N=" "$OUT/lce_profile.log" | cut -c1-130
