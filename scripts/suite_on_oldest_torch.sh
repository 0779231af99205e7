#!/usr/bin/env bash
# The test suite under torch 2.11, the oldest torch the library supports, on this machine's CPU:
# a virtual environment of its own (.venv-torch2.11, or $OLDEST_TORCH_VENV) with torch 2.11.0 from
# PyPI (a CUDA build, about 4.6 GB with its CUDA libraries; its CPU path is what runs here) and
# this project installed editable with its test and mpi extras, then pytest as the README's test
# command runs it. Arguments replace the test paths (default: every test outside tests/kernels,
# as the GPU machine's suite runs). Not part of CI: the GPU machine runs the same suite under its
# own torch 2.11 (benchmarks/gpu/suite.sh).
#
#   bash scripts/suite_on_oldest_torch.sh
#   bash scripts/suite_on_oldest_torch.sh tests/recovery tests/mpi
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
venv=${OLDEST_TORCH_VENV:-.venv-torch2.11}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
venv=$(cd "$venv" && pwd)
"$venv/bin/python" -m pip install -q "torch==2.11.0" -e ".[test,mpi]"
export PATH="$venv/bin:$PATH"  # the ranks' `python3` and the console scripts are the venv's
python3 -c 'import torch; v = torch.__version__.split("+")[0]; assert v == "2.11.0", f"torch {torch.__version__}"'
python3 -m torchcomms.csrc.build  # its cache is keyed by the torch version: 2.13's build stays
bash scripts/byte_compile.sh
if [ $# -eq 0 ]; then
  set -- tests --ignore=tests/kernels
fi
python3 -m pytest -n 3 -q -p no:cacheprovider -rs -p no:benchmark --durations=15 "$@"
