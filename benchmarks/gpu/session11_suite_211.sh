#!/usr/bin/env bash
# One device call (lent H200, torch 2.11): every test outside tests/kernels (the communicator
# core, recovery, control plane, launcher, tracing, FSDP2, benchmarks' smoke runs) under the
# GPU machine's torch, with the carried wheels (pyzmq, structlog, opentelemetry) on PYTHONPATH.
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
python3 -c "import torch; print('torch', torch.__version__)"
timeout 480 python3 -m pytest -q -p no:cacheprovider -n 12 tests --ignore=tests/kernels > "$OUT/suite.log" 2>&1
echo "suite rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -40
