# Sourced by every script in benchmarks/gpu/ (run from the repository root on the device):
# $OUT for logs, the carried wheels (.whl, see the device tool's README) on PYTHONPATH,
# unbuffered Python, and the GPU's state at the start.
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
