#!/usr/bin/env bash
# The gloo engine's small-op claims on the lent machine's 16 host cores (GPU unused), a quieter
# host than the shared 2-core VM: comm_bench at 4 KiB-4 MiB (torchcomms traced and untraced vs
# c10d gloo, with the A/A control), the gloo point-to-point framing ping-pong, and the
# torch.distributed route vs c10d gloo. One call:
#   run(command="bash benchmarks/gpu/gloo_cpu.sh", carry=[".whl"])
# STEPS picks among: small p2p route (default: all three).
source "$(dirname "$0")/prelude.sh"
STEPS=${STEPS:-small p2p route}
{ uptime; nproc; python3 -c 'import torch; print("torch", torch.__version__)'; } | tee "$OUT/host.txt"
if [[ " $STEPS " == *" small "* ]]; then
  timeout ${SMALL_LIMIT_S:-240} python3 benchmarks/comm_bench.py --max-bytes 4M --iters "${ITERS:-100}" --engines 3 \
    --tracing both --control --json "$OUT/comm_small.json" > "$OUT/comm_small.txt" 2> "$OUT/comm_small.err"
  echo "comm_bench small rc=$?"; sed -n '/^| op /,$p' "$OUT/comm_small.txt" | head -40
fi
if [[ " $STEPS " == *" p2p "* ]]; then
  timeout 120 python3 benchmarks/p2p_frame_bench.py --iters 300 --rounds 5 --sizes 4,65536,1048576 \
    > "$OUT/p2p_frame.txt" 2>&1
  echo "p2p_frame_bench rc=$?"; tail -12 "$OUT/p2p_frame.txt"
fi
if [[ " $STEPS " == *" route "* ]]; then
  timeout 200 python3 benchmarks/dist_bench.py --iters "${ROUTE_ITERS:-20}" --steps 10 --small-iters 200 > "$OUT/dist.txt" 2>&1
  echo "dist_bench rc=$?"; tail -15 "$OUT/dist.txt"
fi
uptime | tee -a "$OUT/host.txt"
