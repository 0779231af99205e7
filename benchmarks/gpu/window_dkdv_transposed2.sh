#!/usr/bin/env bash
# One device call (lent H200): the dK/dV kernel on transposed tiles (P^T, dS^T in registers as the
# products' left operands; key-major dS tiles) against the shipped kernel, with TMA loads and one
# loop per program; plus its GPU tests. Logs under $OUT.
source "$(dirname "$0")/prelude.sh"
timeout 150 python3 benchmarks/gpu/exp/dkdv_transposed.py 2>&1 | tee "$OUT/dkdv_t.log" | grep -v "^\[" | tail -20
