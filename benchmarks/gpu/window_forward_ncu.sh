#!/usr/bin/env bash
# One device call: Nsight Compute on the window forward kernels (Triton _fwd, Gluon _fwd_gluon) at
# S=32768, 32x128, window 256: where the warps stall, pipe utilisation, memory throughput.
source "$(dirname "$0")/prelude.sh"
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
timeout 300 $NCU --kernel-name regex:"_fwd$|_fwd_gluon$" --launch-skip 2 --launch-count 2 --section SpeedOfLight \
  --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
  --section LaunchStats --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second,smsp__average_warp_latency_issue_stalled_barrier,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio,smsp__average_warps_issue_stalled_misc_per_issue_active.ratio \
  python3 benchmarks/gpu/exp/forward_once.py > "$OUT/ncu.txt" 2>&1
echo "rc=$?"
grep -v "^==PROF==\|^\s*$\|----" "$OUT/ncu.txt" | grep -i "_fwd\|Duration\|SM Frequency\|Throughput\|stalled\|hmma\|Occupancy\|Registers\|Shared Memory Config\|Block Limit\|Issue Slots\|Warp Cycles Per Issued\|Eligible\|ERR\|error" | cut -c1-150 | head -120
