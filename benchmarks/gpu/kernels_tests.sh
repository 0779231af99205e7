#!/usr/bin/env bash
# Every test of tests/kernels on the GPU (the window kernel's forms, the fused loss's CUDA tests,
# the model, the no-host-wait checks). One device call; the log is $OUT/tests.log.
source "$(dirname "$0")/prelude.sh"
timeout 540 python3 -m pytest -q -p no:cacheprovider -n 6 -rs --durations=10 tests/kernels > "$OUT/tests.log" 2>&1
rc=$?
echo "kernels tests rc=$rc"; grep -E "passed|failed|FAILED|ERROR|SKIPPED" "$OUT/tests.log" | tail -30
exit $rc
