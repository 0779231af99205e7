#!/usr/bin/env bash
# One device call (lent H200): the window kernel's compiled path now makes its operands contiguous
# before the operator saves them (a saved view kept the fused QKV projection alive: 28.62 vs
# 28.00 GiB at 8k); 8k steps with and without compiled blocks, then the static-report and flex tests.
source "$(dirname "$0")/prelude.sh"
timeout 150 python3 benchmarks/step_bench.py --seq 8192 --steps 3 --warmup 2 --compile-blocks \
  --configs fused+window_kernel --json "$OUT/step_8k.json" 2>"$OUT/step_8k.err" | tee "$OUT/step_8k.log" | tail -4
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention.py \
  "tests/kernels/test_attention_window_triton.py::test_static_resource_report_reads_registers_and_spills_from_the_compiler" \
  "tests/kernels/test_attention_window_triton.py::test_window_kernel_compiles_in_one_graph_with_inductor_on_gpu" \
  2>&1 | tee "$OUT/tests.log" | tail -4
