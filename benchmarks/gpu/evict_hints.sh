#!/usr/bin/env bash
# One device call (lent H200): the window kernels with L2 evict_first hints on what is read once
# or never, against the same kernels without them, in alternating rounds (benchmarks/gpu/exp/
# evict_hints.py), then the window kernel's GPU tests on the hinted kernels. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 300 python3 benchmarks/gpu/exp/evict_hints.py 2>&1 | tee "$OUT/evict_hints.log" | grep -v "^\[" | tail -12
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_window_triton.py 2>&1 | tee "$OUT/tests.log" | tail -2
