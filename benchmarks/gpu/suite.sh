#!/usr/bin/env bash
# Every test outside tests/kernels under the device machine's torch (2.11, the oldest the library
# supports), with the carried wheels. One device call; the log is $OUT/suite.log.
source "$(dirname "$0")/prelude.sh"
timeout 540 python3 -m pytest -q -p no:cacheprovider -n 12 -rs tests --ignore=tests/kernels > "$OUT/suite.log" 2>&1
rc=$?
echo "suite rc=$rc"; grep -E "passed|failed|FAILED|ERROR|SKIPPED" "$OUT/suite.log" | tail -30
exit $rc
