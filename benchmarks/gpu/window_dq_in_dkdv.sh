#!/usr/bin/env bash
# One device call (lent H200), for the next session: dQ finished inside the dK/dV kernel
# (WindowConfig.dq_in_dkdv, the last writer of each query block's dS tiles sums its dQ) against the
# shipped backward, then the window kernel's GPU tests (its form among them, bit-identical runs
# included). Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 150 python3 benchmarks/gpu/exp/dkdv_transposed.py 2>&1 | tee "$OUT/dq_in_dkdv.log" | grep -v "^\[" | tail -22
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_window_triton.py 2>&1 \
  | tee "$OUT/tests.log" | tail -2
# The fused loss's probability targets on CUDA (auto takes the chunked route and warns).
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_lce_cuda.py -k probability 2>&1 \
  | tee "$OUT/lce_probability_cuda.log" | tail -2
