"""MPI's blocking collectives against its nonblocking ones polled with ``Test`` on the caller's
thread (as the mpi engine waits), bare mpi4py, per op and size, under whatever MCA settings the
environment gives: run once per ``coll_libnbc_*_algorithm`` setting to see which of libnbc's
algorithms keeps pace with the blocking call (the engine's nonblocking path sits on it).

    OMPI_MCA_coll_libnbc_iallreduce_algorithm=1 \
        mpiexec -n 2 --oversubscribe python3 benchmarks/diagnostics/mpi_nonblocking_algorithms.py --tag ring

Prints one line per op and size: the slowest rank's median µs, blocking / nonblocking, and their ratio.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def _poll(req: Any) -> None:
    polls = 0
    while not req.Test():
        polls += 1
        if polls > 16:
            os.sched_yield()


def _calls(MPI: Any, comm: Any, op: str, nbytes: int) -> tuple[Callable[[], object], Callable[[], object]]:  # noqa: N803
    """The blocking call and the polled nonblocking call of ``op`` for ``nbytes`` per rank, each on its own buffers."""
    n = comm.Get_size()
    count = max(nbytes // 4 // n * n, n)

    def bufs() -> tuple[Any, Any]:
        return torch.randint(-8, 8, (count,)).float().numpy(), torch.empty(count * n).float().numpy()

    (a, a_out), (b, b_out) = bufs(), bufs()
    part = count // n
    even = ([count] * n, [i * count for i in range(n)])  # the v-forms' counts and displacements
    halves = ([part] * n, [i * part for i in range(n)])
    table: dict[str, tuple[str, Callable[[Any, Any], tuple[Any, ...]]]] = {
        "allreduce": ("allreduce", lambda x, y: (MPI.IN_PLACE, x, MPI.SUM)),
        "bcast": ("bcast", lambda x, y: (x, 0)),
        "reduce": ("reduce", lambda x, y: (x, y[:count], MPI.SUM, 0)),
        "allgather": ("allgather", lambda x, y: (x, y)),
        "reduce_scatter_block": ("reduce_scatter_block", lambda x, y: (x, y[:part], MPI.SUM)),
        "alltoall": ("alltoall", lambda x, y: (x, y[:count])),
        "allgatherv": ("allgatherv", lambda x, y: (x, [y, even])),
        "reduce_scatter": ("reduce_scatter", lambda x, y: (x, y[:part], [part] * n, MPI.SUM)),
        "alltoallv": ("alltoallv", lambda x, y: ([x, halves], [y[:count], halves])),
        "gather": ("gather", lambda x, y: (x, y, 0)),
        "scatter": ("scatter", lambda x, y: (y, x, 0)),
    }
    name, args = table[op]
    method = name.capitalize()
    blocking = getattr(comm, method)
    nonblocking = getattr(comm, "I" + name)
    ba, na = args(a, a_out), args(b, b_out)
    return (lambda: blocking(*ba)), (lambda: _poll(nonblocking(*na)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", default="default", help="the label printed for this setting")
    p.add_argument("--ops", default="allreduce,bcast,reduce,allgather,reduce_scatter_block,alltoall,allgatherv,"
                   "reduce_scatter,alltoallv,gather,scatter")
    p.add_argument("--sizes", default="1K,64K,256K,1M,4M,16M", help="bytes per rank, K/M suffixes")
    p.add_argument("--iters", type=int, default=40)
    args = p.parse_args()
    from mpi4py import MPI

    comm, bar = MPI.COMM_WORLD.Dup(), MPI.COMM_WORLD.Dup()
    for op in args.ops.split(","):
        for size in args.sizes.split(","):
            nbytes = int(float(size[:-1]) * {"K": 1 << 10, "M": 1 << 20}[size[-1]]) if size[-1] in "KM" else int(size)
            fns = _calls(MPI, comm, op, nbytes)
            times: list[list[float]] = [[], []]
            for it in range(args.iters + 3):
                for i, fn in enumerate(fns):
                    bar.Barrier()
                    t0 = time.perf_counter()
                    fn()
                    if it >= 3:
                        times[i].append(time.perf_counter() - t0)
            slowest = [bar.allreduce(statistics.median(t), op=MPI.MAX) * 1e6 for t in times]
            if comm.Get_rank() == 0:
                print(f"{args.tag:<8} n={comm.Get_size()} {op:<21} {size:>5}  blocking {slowest[0]:8.0f} us  "
                      f"nonblocking {slowest[1]:8.0f} us  {slowest[1] / slowest[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
