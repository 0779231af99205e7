#!/usr/bin/env bash
# Issue 27, the multi-GPU run: one device call (about 9 minutes at most) on a machine of N >= 2
# GPUs (nvidia-h200-x2, -x4 or -x8: ask the device tool's `status` first). With fewer than 2
# GPUs it says so and exits 0 having run nothing. NVLink multicast stays off (prelude.sh).
#   1. every `gpu` test outside tests/kernels at N ranks (tests/nccl: every op on every GPU, a
#      straggler's timeout then ncclCommShrink to the survivors, the peer that never joins);
#   2. benchmarks/comm_bench.py --device cuda at world N, ours beside c10d's ProcessGroupNCCL,
#      1 KiB-1 GiB (goal: ratio <= 1.02 at >= 1 MiB), with the host time per op;
#   3. fsdp2's overlap: benchmarks/fsdp_bench.py --device cuda where it has that option, else
#      examples/train_fsdp.py on N GPUs with all-gather / reduce-scatter on their own
#      communicators (overlap) and on one (--no-overlap): tokens/s and peak memory of each;
#   4. elastic recovery on GPUs: examples/elastic_train.py --device cuda under torchcomms-run
#      --on-failure shrink, the last rank SIGKILLed mid-run: detection, the survivors' vote,
#      ncclCommShrink and the redone step, with the shrink's time as the example prints it.
# Logs and JSON under $OUT (8 files come back at most). From the lead's checkout:
#   run(command="bash benchmarks/gpu/multi_gpu.sh", kind="nvidia-h200-x2", carry=[".whl"])
source "$(dirname "$0")/prelude.sh"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
if [ "${NGPU:-0}" -lt 2 ]; then
  echo "multi_gpu: ${NGPU:-0} GPU(s) visible; this run needs 2 or more: skipped"
  exit 0
fi
{ uptime; nvidia-smi topo -m 2>/dev/null | head -20; } > "$OUT/machine.txt" 2>&1
echo "multi_gpu: $NGPU GPUs"

# 1. tests at N ranks
timeout ${TEST_LIMIT_S:-180} python3 -m pytest -v -p no:cacheprovider -rs -m gpu tests --ignore=tests/kernels \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "FAILED|ERROR|passed|failed" "$OUT/gpu_tests.log" | tail -20

# 2. the collectives at world N vs c10d NCCL
timeout ${BENCH_LIMIT_S:-150} python3 benchmarks/comm_bench.py --device cuda --nproc "$NGPU" --min-bytes 1K \
  --max-bytes 1G --step-factor 4 --iters ${ITERS:-20} --warmup 3 --tracing both --json "$OUT/comm_bench_n.json" \
  > "$OUT/comm_bench_n.log" 2>&1
echo "comm_bench rc=$?"; sed -n '/^| op /,$p' "$OUT/comm_bench_n.log" | tail -45

# 3. fsdp2: all-gather and reduce-scatter on their own communicators and streams
if python3 benchmarks/fsdp_bench.py --help 2>/dev/null | grep -q -- "--device"; then
  timeout 120 python3 benchmarks/fsdp_bench.py --device cuda --ranks "$NGPU" --json "$OUT/fsdp_bench_n.json" \
    > "$OUT/fsdp.log" 2>&1
  echo "fsdp_bench rc=$?"; tail -15 "$OUT/fsdp.log"
else
  for mode in overlap no-overlap; do
    extra=(); [ "$mode" = no-overlap ] && extra=(--no-overlap)
    echo "== train_fsdp $mode" >> "$OUT/fsdp.log"
    timeout 60 python3 -m launcher --nproc-per-node gpu examples/train_fsdp.py --device cuda --steps 30 \
      --dim 512 --layers 8 --seq 512 --batch 8 "${extra[@]}" >> "$OUT/fsdp.log" 2>&1
    echo "train_fsdp $mode rc=$?"
  done
  grep -E "^== |tokens/s|world|Error" "$OUT/fsdp.log" | tail -12
fi

# 4. elastic recovery on GPUs: the last rank dies at step 15
timeout 90 python3 -m launcher --nproc-per-node gpu --on-failure shrink examples/elastic_train.py --device cuda \
  --steps 40 --fail-rank $((NGPU - 1)) --fail-step 15 > "$OUT/elastic.log" 2>&1
echo "elastic rc=$?"; grep -E "membership|failing|step +[0-9]+ |exit code|root cause" "$OUT/elastic.log" | tail -12
uptime
