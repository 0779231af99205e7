#!/usr/bin/env bash
# The nccl backend on the lent GPU(s), one device call: every `gpu` test of tests/nccl (world
# size 1 on one GPU; the N-rank tests run when N >= 2 GPUs are present), the CPU tests of the
# stream-ordered completion path, then benchmarks/comm_bench.py --device cuda with one rank per
# GPU (ours beside c10d's ProcessGroupNCCL, ratio and host overhead per op).
# Needs the carried wheels (pyzmq, msgpack, structlog, rich and its needs: see prelude.sh).
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
timeout 300 python3 -m pytest -v -p no:cacheprovider -m "gpu or not gpu" tests/nccl > "$OUT/nccl_tests.log" 2>&1
echo "nccl tests rc=$?"; grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/nccl_tests.log" | tail -40
grep -E "^E " "$OUT/nccl_tests.log" | head -40
timeout ${BENCH_LIMIT_S:-240} python3 benchmarks/comm_bench.py --device cuda --nproc "$NGPU" --min-bytes 4K --max-bytes 256M \
  --iters ${ITERS:-30} --warmup 5 --tracing both --json "$OUT/comm_bench_cuda.json" 2>&1 | tee "$OUT/comm_bench_cuda.log"
echo "comm_bench rc=$?"
