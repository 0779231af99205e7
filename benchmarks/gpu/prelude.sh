# Sourced by every runner in benchmarks/gpu/, each one device call from the repository root:
#   run(command="bash benchmarks/gpu/<claim>.sh", carry=[".whl"])
# Sets $OUT for logs (the device tool's folder that comes back; out/gpu elsewhere), installs the
# carried wheels (.whl: the anchors Liger and Cut Cross-Entropy, pyzmq, structlog...; see
# /work/.library/device/README.md) into /tmp/site, puts the repository and them on PYTHONPATH,
# unbuffers Python and records the GPU's state at the start.
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
# WHL_DIR: where the carried wheels are (.whl; ../../.whl for a tree copied under .nccl_carry/)
WHL_DIR=${WHL_DIR:-.whl}
if ls "$WHL_DIR"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL_DIR"/*.whl \
    || { echo "prelude: installing the carried wheels failed" >&2; exit 1; }
else
  echo "prelude: no wheels in $WHL_DIR (pyzmq, structlog... may be missing)" >&2
fi
# NVLink multicast stays off on every lent machine (see the device tool's KINDS.md)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD:/tmp/site
export PYTHONUNBUFFERED=1
# The machine sets PYTHONDONTWRITEBYTECODE and its venv holds no bytecode, so every process
# compiled torch's and sympy's sources again (~5 s per `import torch.distributed.fsdp`; a rank
# restarted under a loaded suite was still importing after 100 s). Bytecode goes to a cache,
# filled once here.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
python3 -c "import torch.distributed.fsdp, torch.distributed.tensor, fsdp2, torchcomms" \
  || { echo "prelude: importing torch, fsdp2 and torchcomms failed" >&2; exit 1; }
# the tree's own bytecode, as scripts/setup.sh makes it elsewhere
bash scripts/byte_compile.sh >/dev/null \
  || { echo "prelude: byte-compiling the tree failed" >&2; exit 1; }
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
