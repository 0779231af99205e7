"""Bare mpi4py ``Allreduce`` (float32, in place) per size under whatever MCA settings the
environment gives: run under ``mpiexec`` once per setting to see which of Open MPI's allreduce
algorithms (``coll_tuned_allreduce_algorithm``, ``coll/han``, ``coll/sm``, single copy on or
off) is fastest on a host, the floor the mpi engine's large collectives sit on.

    OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=4 \
        mpiexec -n 2 --oversubscribe python3 benchmarks/diagnostics/mpi_allreduce_algorithms.py --tag ring

Prints one line: the tag, then per size the slowest rank's median time and its bus bandwidth.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", default="default", help="the label printed for this setting")
    p.add_argument("--sizes-mib", default="1,4,16,64", help="comma-separated sizes in MiB")
    p.add_argument("--iters", type=int, default=30)
    args = p.parse_args()
    from mpi4py import MPI

    comm, bar = MPI.COMM_WORLD.Dup(), MPI.COMM_WORLD.Dup()
    n = comm.Get_size()
    cells = []
    for mib in (float(s) for s in args.sizes_mib.split(",")):
        nbytes = int(mib * (1 << 20))
        buf = torch.randint(-8, 8, (nbytes // 4,)).float().numpy()
        times = []
        for it in range(args.iters + 3):
            bar.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, buf, MPI.SUM)
            if it >= 3:
                times.append(time.perf_counter() - t0)
        slowest = bar.allreduce(statistics.median(times), op=MPI.MAX)
        busbw = nbytes / slowest * 2 * (n - 1) / n / 1e9
        cells.append(f"{mib:g}M {slowest * 1e6:.0f} us {busbw:.2f} GB/s")
    if comm.Get_rank() == 0:
        print(f"{args.tag:<10} n={n}  " + "  |  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
