#!/usr/bin/env bash
# One device call (lent H200): the kernels' GPU tests after the entry points became traceable by
# torch.compile (custom operators under compile; fullgraph tests with Inductor among them), then
# a fullgraph compile of the small model on each attention path. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 420 python3 -m pytest -q -p no:cacheprovider tests/kernels 2>&1 | tee "$OUT/tests.log" | tail -4
timeout 150 python3 benchmarks/gpu/exp/compile_model.py 2>&1 | tee "$OUT/compile_model.log" | tail -6
