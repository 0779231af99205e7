#!/usr/bin/env bash
# The MPI engine's claims (issue 25) on the lent machine's 16 host cores (GPU unused): whether
# libnbc's nonblocking all-reduce keeps pace with the blocking call per algorithm (bare mpi4py),
# the layers of a large all-reduce (bare call, hand-off, engine job, backend, whole dispatch path)
# on the default path and with the 64 KiB bound, then comm_bench's MPI engine vs bare mpi4py vs
# c10d gloo at 2 and 4 ranks. One call:
#   run(command="bash benchmarks/gpu/mpi_cpu.sh", carry=[".whl"])
# STEPS picks among: algos layers bench (default: all three).
source "$(dirname "$0")/prelude.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
STEPS=${STEPS:-algos layers bench}
{ uptime; nproc; python3 -c 'import mpi4py, mpi4py.MPI as M; print("mpi4py", mpi4py.__version__, M.Get_library_version().splitlines()[0])'; } | tee "$OUT/host.txt"
if [[ " $STEPS " == *" algos "* ]]; then
  for n in 2 4; do
    for a in 0 1 3; do
      OMPI_MCA_coll_libnbc_iallreduce_algorithm=$a mpiexec -n "$n" --oversubscribe python3 \
        benchmarks/diagnostics/mpi_nonblocking_algorithms.py --ops allreduce --sizes 1K,64K,1M,4M,16M --iters 30 --tag "alg$a"
    done
  done 2>&1 | tee "$OUT/nonblocking_algos.txt"
fi
if [[ " $STEPS " == *" layers "* ]]; then
  for bound in default 65536; do
    extra=(); [ "$bound" != default ] && extra=(--nonblocking-max "$bound")
    echo "== path: $bound"
    mpiexec -n 2 --oversubscribe python3 benchmarks/diagnostics/mpi_op_layers.py --sizes-mib 1,4,16 --iters 60 "${extra[@]}"
  done 2>&1 | tee "$OUT/layers.txt"
fi
if [[ " $STEPS " == *" bench "* ]]; then
  for n in ${NPROCS:-2 4}; do
    timeout 240 python3 benchmarks/comm_bench.py --engine mpi --nproc "$n" --ops all_reduce --min-bytes 1K \
      --max-bytes 64M --iters "${ITERS:-20}" ${BENCH_ARGS:-} > "$OUT/comm_mpi_$n.txt" 2> "$OUT/comm_mpi_$n.err"
    echo "comm_bench mpi n=$n rc=$?"; tail -25 "$OUT/comm_mpi_$n.txt"
  done
fi
uptime | tee -a "$OUT/host.txt"
