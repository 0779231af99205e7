#!/usr/bin/env bash
# Bytecode for the source tree: the packages pyproject ships, and the tests, benchmarks and
# examples that processes import. Where PYTHONDONTWRITEBYTECODE is set (this project's VMs, the
# GPU machine) Python never caches bytecode itself, and an editable install gets none from pip,
# so without this every process would compile what it imports again. Called by scripts/setup.sh
# and benchmarks/gpu/prelude.sh; tests/packaging/test_bytecode.py reads the list below.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m compileall -q torchcomms fsdp2 launcher kernels tests benchmarks examples
