#!/usr/bin/env bash
# One device call: Nsight Compute on the window backward kernels (delta, dK/dV + dS, dQ from dS) at
# S=32768, 32x128, window 256 (clocks locked at base by ncu): stalls, pipe utilisation, memory.
source "$(dirname "$0")/prelude.sh"
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
M=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
for r in long_scoreboard wait barrier short_scoreboard math_pipe_throttle mio_throttle not_selected selected dispatch_stall lg_throttle drain no_instruction; do
  M="$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"; done
timeout 200 $NCU --kernel-name regex:"_bwd_" --launch-skip 3 --launch-count 3 --section SpeedOfLight \
  --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --metrics $M \
  python3 benchmarks/gpu/exp/backward_once.py > "$OUT/ncu_bwd.txt" 2>&1
echo "rc=$?"
grep -v "^==PROF==\|^\s*$\|----" "$OUT/ncu_bwd.txt" | grep -i "_bwd\|Duration\|SM Frequency\|Throughput\|stalled\|hmma\|Achieved Occupancy\|Registers Per\|Block Limit Reg\|Block Limit Shared\|Issue Slots\|Warp Cycles Per Issued\|Spill\|Local\|ERR" | cut -c1-120 | head -90
