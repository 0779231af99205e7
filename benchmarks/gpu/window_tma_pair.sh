#!/usr/bin/env bash
# One device call (lent H200): the window kernels with TMA descriptor loads, the forward with two
# query blocks per program (shared key tiles), the dK/dV kernel's one loop over the GQA group, all
# timed queued (calls back to back), against the first version of the module (carried in .exp/,
# not committed) and stock flex in the same run; bench shape (32 x 128) and the model's
# (32/8 heads x 64). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_window_triton.py -k "gpu or cuda" \
  2>&1 | tee "$OUT/tests.log" | tail -1
timeout 250 python3 benchmarks/window_tune.py --budget-s 150 --baseline .exp/window_triton_v1.py \
  --json "$OUT/tune128.json" \
  --fwd-shapes 64x32/w4/s2 64x32/w4/s2/tma 64x32/w4/s3/tma 64x64/w4/s3/tma 64x32/w4/s2/pair \
    64x32/w4/s2/tma/pair 64x32/w4/s3/tma/pair 64x64/w4/s2/tma/pair \
  --dkdv-shapes 64x64/w4/s2 64x64/w4/s2/tma 64x64/w4/s3/tma \
  --dq-shapes 64x64/w4/s2 64x64/w4/s2/tma 64x32/w4/s2/tma 64x64/w4/s3/tma \
  --dqds-shapes 0x0/w4/s2 0x0/w4/s4 0x0/w4/s2/tma 0x0/w4/s4/tma > "$OUT/tune128.log" 2>&1
sed -n '/^window_tune /,$p' "$OUT/tune128.log"
timeout 150 python3 benchmarks/window_tune.py --dim 64 --heads 32 --kv-heads 8 --seq 32768 --no-flex --budget-s 80 \
  --baseline .exp/window_triton_v1.py --json "$OUT/tune64.json" \
  --fwd-shapes 64x64/w4/s2 64x64/w4/s2/tma 64x64/w4/s2/tma/pair 64x32/w4/s2/tma/pair 64x64/w4/s3/tma/pair \
  --dkdv-shapes 64x64/w4/s3 64x64/w4/s3/tma 64x64/w4/s2/tma \
  --dq-shapes 64x64/w4/s2 64x64/w4/s2/tma --dqds-shapes 0x0/w4/s2 0x0/w4/s2/tma > "$OUT/tune64.log" 2>&1
sed -n '/^window_tune /,$p' "$OUT/tune64.log"
