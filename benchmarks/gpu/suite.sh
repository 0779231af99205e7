#!/usr/bin/env bash
# Every test outside tests/kernels under the device machine's torch (2.11, the oldest the library
# supports), with the carried wheels. One device call; the log is $OUT/suite.log.
source "$(dirname "$0")/prelude.sh"
# the C++ extension built once now, as scripts/setup.sh does elsewhere, not by the first ranks
# that need it in the middle of a loaded suite
python3 -m torchcomms.csrc.build || { echo "suite: building the C++ extension failed" >&2; exit 1; }
# -v: a line per test as it ends, so that a run cut short by the limit still names its failures
timeout ${SUITE_LIMIT_S:-540} python3 -m pytest -v -p no:cacheprovider -n ${SUITE_WORKERS:-14} -rs -p no:benchmark \
  ${SUITE_PATHS:-tests --ignore=tests/kernels} > "$OUT/suite.log" 2>&1
rc=$?
echo "suite rc=$rc"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -40
exit $rc
