# Sourced by every runner in benchmarks/gpu/, each one device call from the repository root:
#   run(command="bash benchmarks/gpu/<claim>.sh", carry=[".whl"])
# Sets $OUT for logs (the device tool's folder that comes back; out/gpu elsewhere), installs the
# carried wheels (.whl: the anchors Liger and Cut Cross-Entropy, pyzmq, structlog...; see
# /work/.library/device/README.md) into /tmp/site, puts the repository and them on PYTHONPATH,
# unbuffers Python and records the GPU's state at the start.
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "prelude: installing the carried wheels failed" >&2; exit 1; }
fi
export PYTHONPATH=$PWD:/tmp/site
export PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
