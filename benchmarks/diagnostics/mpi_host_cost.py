"""Host cost per op of the mpi backend on ONE rank (no peer to wait for, so no scheduling of a
second rank in the figure): a 1 KiB all_reduce through ``TorchComm`` vs the bare mpi4py call,
wall time and the process's CPU time per op (medians over rounds; CPU time leaves out time
spent descheduled, so it stays meaningful on a loaded machine).

    mpiexec -n 1 python3 benchmarks/diagnostics/mpi_host_cost.py                 # engine thread
    mpiexec -n 1 python3 benchmarks/diagnostics/mpi_host_cost.py --nonblocking-max 262144
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import torchcomms  # noqa: E402
from torchcomms import ReduceOp  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=3000, help="ops per round")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--nonblocking-max", type=int, default=None, help="hint mpi.nonblocking_max_bytes")
    p.add_argument("--tracing", choices=("on", "off"), default="on")
    args = p.parse_args()
    os.environ["TORCHCOMM_TRACING_DISABLE"] = "0" if args.tracing == "on" else "1"
    hints = {} if args.nonblocking_max is None else {"mpi.nonblocking_max_bytes": str(args.nonblocking_max)}
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "host-cost", timeout=timedelta(seconds=60), hints=hints)
    from mpi4py import MPI

    bare = MPI.COMM_WORLD.Dup()
    t = torch.ones(256)
    a = t.numpy()

    def ours() -> None:
        for _ in range(args.ops):
            comm.all_reduce(t, ReduceOp.SUM, False)

    def anchor() -> None:
        for _ in range(args.ops):
            bare.Allreduce(MPI.IN_PLACE, a, MPI.SUM)

    wall: dict[str, list[float]] = {"torchcomms": [], "mpi4py": []}
    cpu: dict[str, list[float]] = {"torchcomms": [], "mpi4py": []}
    for _ in range(args.rounds):
        for name, fn in (("torchcomms", ours), ("mpi4py", anchor)):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[name].append((time.perf_counter() - t0) / args.ops * 1e6)
            cpu[name].append((time.process_time() - c0) / args.ops * 1e6)
    load = os.getloadavg()[0]
    print(f"1 KiB all_reduce, 1 rank, tracing {args.tracing}, hints {hints or 'none'}, load {load:.1f}")
    for name in wall:
        print(f"  {name:10s} wall {statistics.median(wall[name]):7.2f} µs (best round {min(wall[name]):.2f}), "
              f"CPU {statistics.median(cpu[name]):7.2f} µs per op")
    comm.finalize()


if __name__ == "__main__":
    main()
