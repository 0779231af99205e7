#!/usr/bin/env bash
# The MPI engine's claims (issue 25) on the lent machine's 16 host cores (GPU unused): which of
# Open MPI's allreduce algorithms is fastest per size (bare mpi4py, one mpiexec per setting),
# then comm_bench's MPI engine vs bare mpi4py vs c10d gloo at 2 and 4 ranks. One call:
#   run(command="bash benchmarks/gpu/mpi_cpu.sh", carry=[".whl"])
source "$(dirname "$0")/prelude.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{ uptime; nproc; python3 -c 'import mpi4py, mpi4py.MPI as M; print("mpi4py", mpi4py.__version__, M.Get_library_version().splitlines()[0])'; } | tee "$OUT/host.txt"
algos() {
  local n=$1 d=benchmarks/diagnostics/mpi_allreduce_algorithms.py
  mpiexec -n "$n" --oversubscribe python3 $d --tag default
  for a in ${ALGOS:-2 3 4 5 6}; do
    OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=$a \
      mpiexec -n "$n" --oversubscribe python3 $d --tag "tuned$a"
  done
  OMPI_MCA_coll_han_priority=100 mpiexec -n "$n" --oversubscribe python3 $d --tag han
  OMPI_MCA_smsc=^cma mpiexec -n "$n" --oversubscribe python3 $d --tag no-cma
}
if [ "${SKIP_ALGOS:-0}" != 1 ]; then algos 2 2>&1 | tee -a "$OUT/algos.txt"; algos 4 2>&1 | tee -a "$OUT/algos.txt"; fi
for n in ${NPROCS:-2 4}; do
  timeout 240 python3 benchmarks/comm_bench.py --engine mpi --nproc "$n" --ops all_reduce --min-bytes 1K \
    --max-bytes 64M --iters "${ITERS:-20}" ${BENCH_ARGS:-} > "$OUT/comm_mpi_$n.txt" 2> "$OUT/comm_mpi_$n.err"
  echo "comm_bench mpi n=$n rc=$?"; tail -25 "$OUT/comm_mpi_$n.txt"
done
uptime | tee -a "$OUT/host.txt"
