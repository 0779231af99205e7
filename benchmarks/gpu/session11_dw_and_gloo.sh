#!/usr/bin/env bash
# One device call (lent H200, torch 2.11): which cuBLAS form of the fused loss's accumulating
# weight-gradient product is fastest (benchmarks/gpu/exp/dw_accumulate.py), then the
# communicator core's CPU tests under torch 2.11 (the gloo one-day op backstop set through
# ProcessGroupGloo._set_default_timeout was only ever run on torch 2.13). Needs the carried
# wheels: pyzmq, structlog, opentelemetry (api, sdk, semantic conventions).
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
python3 -c "import torch; print('torch', torch.__version__)"
timeout 150 python3 benchmarks/gpu/exp/dw_accumulate.py > "$OUT/dw.log" 2>&1
echo "dw rc=$?"; cat "$OUT/dw.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 330 python3 -m pytest -q -p no:cacheprovider -n 12 tests/torchcomms tests/recovery tests/control \
  > "$OUT/core_tests.log" 2>&1
echo "core tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/core_tests.log" | tail -30
