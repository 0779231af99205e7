#!/usr/bin/env bash
# One device call (lent H200): every kernels test on the session's final code (device guards, the
# launcher's lock). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels 2>&1 | tee "$OUT/tests.log" | tail -2
