#!/usr/bin/env bash
# One device call (lent H200): the packed dS buffer (far-edge and diagonal tiles in one slot)
# against the unpacked one in alternating rounds, then the kernels' GPU tests (the static
# report's ptxas fix and flex inside a caller's compile among them), then the fused loss under
# torch.compile beside the eager routes. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 200 python3 benchmarks/gpu/exp/packed_ds.py 2>&1 | tee "$OUT/packed_ds.log" | tail -6
timeout 240 python3 -m pytest -q -p no:cacheprovider -x tests/kernels/test_attention_window_triton.py \
  tests/kernels/test_attention.py tests/kernels/test_lce_cuda.py 2>&1 | tee "$OUT/tests.log" | tail -3
timeout 120 python3 benchmarks/lce_bench.py --device cuda --reps 5 --n 4096 --only "torch.compile" "bf16 dW" \
  --json "$OUT/lce.json" 2>&1 | tee "$OUT/lce.log" | tail -9
