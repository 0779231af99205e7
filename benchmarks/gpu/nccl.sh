#!/usr/bin/env bash
# The nccl backend on the lent GPU(s), one device call of at most ~9 minutes:
#   1. every test of tests/nccl (the `gpu` ones at world size 1 on one GPU, fsdp2, the route and the
#      launcher above the backend among them; the N-rank ones when
#      N >= 2 GPUs are present; the CPU tests of the host path and the completion poller);
#   2. the claim: benchmarks/comm_bench.py --device cuda, one rank per GPU, 4 KiB-256 MiB, ours
#      (traced and untraced) beside c10d's ProcessGroupNCCL, with the host time per op;
#   3. the host time per op broken down (benchmarks/diagnostics/nccl_host_path.py --device cuda:
#      c10d's dist.all_reduce, its engine call on the current stream and on the engine's stream,
#      a CUDA event record, ours untraced / traced / traced without timing), and the same for the
#      tree in $BEFORE_TREE (default ../before) when it exists: before/after in one run.
# Logs and JSON under $OUT (8 files at most come back). From the lead's checkout, for a worktree:
#   rsync -a --delete --exclude .git /work/wt/<name>/ .nccl_carry/repo/
#   git -C /work/wt/<name> archive <base commit> | tar -x -C .nccl_carry/before   # optional
#   run(command="cd .nccl_carry/repo && WHL_DIR=../../.whl bash benchmarks/gpu/nccl.sh",
#       carry=[".nccl_carry", ".whl"])
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
{ uptime; python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'; } \
  | tee -a "$OUT/gpu.txt"

# the C++ extension (the route's backend wrapper) built once now, as scripts/setup.sh does elsewhere
python3 -m torchcomms.csrc.build > "$OUT/build.log" 2>&1 || { echo "nccl: building the C++ extension failed"; tail -5 "$OUT/build.log"; }
timeout ${TEST_LIMIT_S:-220} python3 -m pytest -v -p no:cacheprovider -rs tests/nccl > "$OUT/nccl_tests.log" 2>&1
echo "nccl tests rc=$?"
grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/nccl_tests.log" | grep -v "^tests/nccl/test_\(completion\|host_path\)" | tail -40
grep -E "^E " "$OUT/nccl_tests.log" | head -30

timeout ${BENCH_LIMIT_S:-180} python3 benchmarks/comm_bench.py --device cuda --nproc "$NGPU" --min-bytes 4K --max-bytes 256M \
  --iters ${ITERS:-30} --warmup 5 --tracing both --json "$OUT/comm_bench_cuda.json" > "$OUT/comm_bench_cuda.log" 2>&1
echo "comm_bench rc=$?"
sed -n '/^| op /,$p' "$OUT/comm_bench_cuda.log" | head -60

HOST_ARGS="--device cuda --rounds ${HOST_ROUNDS:-15} --burst 100 --profile ${HOST_PROFILE:-0}"
timeout 50 python3 benchmarks/diagnostics/nccl_host_path.py $HOST_ARGS --json "$OUT/host_path.json" > "$OUT/host_path.log" 2>&1
echo "host path rc=$?"; sed -n '/^nccl_host_path/,/^cProfile/p' "$OUT/host_path.log"
BEFORE=${BEFORE_TREE:-../before}
if [ -d "$BEFORE/torchcomms" ]; then
  cp benchmarks/diagnostics/nccl_host_path.py "$BEFORE/benchmarks/diagnostics/"
  (cd "$BEFORE" && PYTHONPATH=$PWD:/tmp/site timeout 50 python3 benchmarks/diagnostics/nccl_host_path.py $HOST_ARGS) \
    > "$OUT/host_path_before.log" 2>&1
  echo "host path (before: $BEFORE) rc=$?"; tail -14 "$OUT/host_path_before.log"
fi
uptime
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
