#!/usr/bin/env bash
# One device call (lent H200): the forward with several query blocks per program in one flattened
# loop (Blocks.flat) against the shipped forward, kernels alone and whole passes, and the window
# kernel's GPU tests with the flat forms. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 90 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_attention_window_triton.py -k "gpu or cuda" \
  2>&1 | tee "$OUT/tests.log" | tail -2
timeout 170 python3 benchmarks/window_tune.py --no-flex --budget-s 100 --json "$OUT/tune128.json" --kernels fwd \
  --fwd-shapes 64x64/w4/s3/tma 64x64/w4/s2/tma/flat2 64x64/w4/s2/tma/flat4 64x64/w4/s2/tma/flat8 \
  64x32/w4/s2/tma/flat4 64x32/w4/s3/tma/flat4 128x64/w8/s2/tma/flat2 64x64/w4/s3/tma > "$OUT/tune128.log" 2>&1
sed -n '/^window_tune /,$p' "$OUT/tune128.log"; grep '"fwd"' "$OUT/tune128.log" | cut -c1-150
