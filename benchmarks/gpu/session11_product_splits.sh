#!/usr/bin/env bash
# One device call (lent H200): the fused loss's three products whole and as column/row blocks
# at the N=16384 <= 256 MiB chunk shape (benchmarks/gpu/exp/product_splits.py), then the
# communicator core's CPU tests under torch 2.11 (carried wheels: pyzmq, structlog, opentelemetry).
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
timeout 200 python3 benchmarks/gpu/exp/product_splits.py --rounds 7 > "$OUT/splits.log" 2>&1
echo "splits rc=$?"; cat "$OUT/splits.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
# the communicator core's CPU tests under torch 2.11, now that ranks keep the carried wheels' path
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 12 tests/torchcomms tests/recovery tests/control \
  > "$OUT/core_tests.log" 2>&1
echo "core tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/core_tests.log" | tail -30
