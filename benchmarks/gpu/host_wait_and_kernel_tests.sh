#!/usr/bin/env bash
# One device call (lent H200): the "never makes the host wait" tests, first with the fused loss's
# old blocking copy put back (they must fail), then as committed; then every kernels test.
source "$(dirname "$0")/prelude.sh"
bash "$(dirname "$0")/sync_checks.sh"
git diff --stat kernels/lce/config.py
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels 2>&1 | tee "$OUT/tests.log" | tail -3
