#!/usr/bin/env bash
# One device call (lent H200), on the tenth session's last code: every kernels test (the
# no-host-wait helper now warms up twice), then the block-mask builder's host cost on the GPU.
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 260 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^FAILED" "$OUT/tests.log"; tail -1 "$OUT/tests.log"
for s in 256 32768; do
  timeout 120 python3 benchmarks/block_mask_build_overhead.py --device cuda --seq $s --window 256 --reps 51 2>&1 | tail -4
done
