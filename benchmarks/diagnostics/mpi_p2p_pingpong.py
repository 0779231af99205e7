"""Point-to-point round trips through the mpi engine (2 ranks under ``mpiexec``): rank 0
sends and then receives, rank 1 receives and then sends, sync ``comm.send`` / ``comm.recv``
with default tracing; the median over rounds of the mean round trip, per size. Run it on two
trees alternately (``PYTHONPATH``) to compare receive paths.

    mpiexec -n 2 --bind-to none python3 benchmarks/diagnostics/mpi_p2p_pingpong.py --label mine
"""
from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta

import torch

import torchcomms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="")
    ap.add_argument("--sizes", default="4,65536,1048576", help="bytes per message (float32)")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    comm = torchcomms.new_comm("mpi", "cpu", "pingpong", timeout=timedelta(seconds=60))
    rank, peer = comm.get_rank(), 1 - comm.get_rank()
    out = {}
    for nbytes in (int(s) for s in args.sizes.split(",")):
        t = torch.ones(max(1, nbytes // 4))

        def round_trip() -> None:
            if rank == 0:
                comm.send(t, peer, False)
                comm.recv(t, peer, False)
            else:
                comm.recv(t, peer, False)
                comm.send(t, peer, False)

        for _ in range(50):
            round_trip()
        means = []
        for _ in range(args.rounds):
            comm.barrier(False)
            t0 = time.perf_counter()
            for _ in range(args.iters):
                round_trip()
            means.append((time.perf_counter() - t0) / args.iters * 1e6)
        out[nbytes] = round(statistics.median(means), 1)
    if rank == 0:
        print(args.label, "round trip us by bytes:", out, flush=True)
    comm.finalize()


if __name__ == "__main__":
    main()
