#!/usr/bin/env bash
# The FSDP2 claim (issue 23: >= 1.15x stock fully_shard's step throughput at 4 CPU ranks, at no
# more peak allocated memory: the alloc column) on the lent machine's 16 host cores, GPU unused:
# 4 ranks on gloo with an idle core each for the engine threads, which the project's 2 shared
# cores cannot give. One call:
#   run(command="bash benchmarks/gpu/fsdp_cpu.sh", carry=[".whl"])
# Logs and JSON under $OUT.
source "$(dirname "$0")/prelude.sh"
{ uptime; nproc; python3 -c 'import torch; print("torch", torch.__version__, "threads", torch.get_num_threads())'; } \
  | tee -a "$OUT/host.txt"
t0=$(date +%s)
timeout ${LIMIT_A_S:-300} python3 benchmarks/fsdp_bench.py --ranks 4 --steps 12 --sites 0 --json "$OUT/fsdp_bench_4r.json" \
  > "$OUT/fsdp_bench_4r.log" 2>&1
echo "fsdp_bench (dim 256) rc=$? in $(( $(date +%s) - t0 )) s"; cat "$OUT/fsdp_bench_4r.log" | tail -45
uptime | tee -a "$OUT/host.txt"
t0=$(date +%s)
timeout ${LIMIT_B_S:-220} python3 benchmarks/fsdp_bench.py --ranks 4 --steps 10 --dim 512 --layers 6 --sites 0 \
  --json "$OUT/fsdp_bench_4r_dim512.json" > "$OUT/fsdp_bench_4r_dim512.log" 2>&1
echo "fsdp_bench (dim 512) rc=$? in $(( $(date +%s) - t0 )) s"; tail -45 "$OUT/fsdp_bench_4r_dim512.log"
uptime | tee -a "$OUT/host.txt"
# fsdp2's in-place gloo paths against gloo's own ops, alone (time and scratch per op)
timeout ${LIMIT_C_S:-120} python3 benchmarks/diagnostics/gloo_fsdp_paths.py --ranks 4 --reps 20 2>&1 \
  | grep -v '^USDT\|^$' | tee "$OUT/gloo_fsdp_paths.log"
