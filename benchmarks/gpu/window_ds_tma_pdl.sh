#!/usr/bin/env bash
# One device call (lent H200): dS through TMA descriptors and programmatic dependent launches
# against the shipped window kernels (forward, backward, f+b queued at 32k), then the window
# kernel's GPU tests (these forms among them, bit-identical runs included). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 benchmarks/gpu/exp/ds_tma_pdl.py 2>&1 | tee "$OUT/ds_tma_pdl.log" | grep -v "^\[" | tail -24
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_window_triton.py 2>&1 \
  | tee "$OUT/tests.log" | tail -3
