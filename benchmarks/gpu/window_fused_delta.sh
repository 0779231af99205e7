#!/usr/bin/env bash
# One device call (lent H200): delta computed inside the backward kernels (WindowConfig.fused_delta)
# against the delta kernel, the window kernel's GPU tests (new forms included), and where the host's
# time per call goes (autograd, Triton launches, descriptors). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_window_triton.py -k "gpu or cuda" \
  2>&1 | tee "$OUT/tests.log" | tail -2
timeout 150 python3 benchmarks/window_tune.py --budget-s 60 --json "$OUT/tune128.json" \
  --kernels fwd dkdv dqds dkdv-delta --dkdv-shapes 64x64/w4/s2/tma \
  --fwd-shapes 64x64/w4/s3/tma 64x64/w4/s4/tma 128x64/w8/s3/tma 128x128/w8/s2/tma 64x128/w4/s2/tma \
  --dkdv-delta-shapes 64x64/w4/s2/tma 64x64/w4/s3/tma --dqds-shapes 0x0/w4/s4/tma > "$OUT/tune128.log" 2>&1
sed -n '/^window_tune /,$p' "$OUT/tune128.log"
timeout 100 python3 benchmarks/window_tune.py --dim 64 --kv-heads 8 --no-flex --budget-s 40 --json "$OUT/tune64.json" \
  --kernels dkdv dq dkdv-delta --dkdv-shapes 64x64/w4/s3/tma --dkdv-delta-shapes 64x64/w4/s3/tma 64x64/w4/s2/tma \
  --dq-shapes 64x64/w4/s2/tma > "$OUT/tune64.log" 2>&1
sed -n '/^window_tune /,$p' "$OUT/tune64.log"
timeout 80 python3 benchmarks/window_profile.py --seq 8192 32768 --cprofile-calls 20 > "$OUT/profile.log" 2>&1
grep -A16 "^variant" "$OUT/profile.log"; tail -4 "$OUT/profile.log"
