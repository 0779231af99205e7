"""The host cost of one MPI op through each layer, with the caches warm and after a large op
would have flushed them (one rank under ``mpiexec``: the op itself is a no-op, so only the host
path is timed).

Before each timed op of a cold round, a write over a buffer of ``--flush-mib`` evicts the
interpreter's code and data from the caches, as the data of a large all-reduce does between two
ops: 4 MiB leaves the L3 of most hosts warm (a 1 MiB op on two ranks), 48 MiB flushes it too (a
16 MiB op). Layers, each a 1 KiB float32 all_reduce:

- ``bare``: mpi4py's blocking ``Allreduce`` (what the bare contender of comm_bench pays);
- ``nb``: mpi4py's ``Iallreduce`` polled by ``Test``;
- ``backend``: the backend's ``all_reduce`` and ``EngineHandle.wait_until`` (no dispatch path);
- ``untraced``: ``TorchComm.all_reduce`` on a communicator made with tracing off;
- ``traced``: the same with the default tracing.

    mpiexec -n 1 python3 benchmarks/diagnostics/mpi_cold_dispatch.py --flush-mib 4,48
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import torchcomms  # noqa: E402
from torchcomms import ReduceOp  # noqa: E402


def _comm(name: str, traced: bool) -> torchcomms.TorchComm:
    os.environ["TORCHCOMM_TRACING_DISABLE"] = "0" if traced else "1"
    return torchcomms.new_comm("mpi", torch.device("cpu"), name, timeout=timedelta(seconds=60))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flush-mib", default="4,48", help="flush sizes of the cold rounds, comma-separated")
    p.add_argument("--iters", type=int, default=300)
    args = p.parse_args()
    traced, untraced = _comm("cold-traced", True), _comm("cold-untraced", False)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() != 1:
        raise SystemExit("run it on one rank: mpiexec -n 1 python3 ...")
    bare = MPI.COMM_WORLD.Dup()
    backend = untraced._core.backend  # noqa: SLF001 - a diagnostic of the layers below the API
    t = torch.ones(256)
    a = t.numpy()

    def nonblocking() -> None:
        req = bare.Iallreduce(MPI.IN_PLACE, a, MPI.SUM)
        while not req.Test():
            pass

    layers: dict[str, Callable[[], object]] = {
        "bare": lambda: bare.Allreduce(MPI.IN_PLACE, a, MPI.SUM),
        "nb": nonblocking,
        "backend": lambda: backend.all_reduce(t, ReduceOp.SUM).wait_until(time.monotonic() + 60),
        "untraced": lambda: untraced.all_reduce(t, ReduceOp.SUM, False),
        "traced": lambda: traced.all_reduce(t, ReduceOp.SUM, False),
    }
    flushes = [0] + [int(s) for s in args.flush_mib.split(",")]
    buf = torch.empty(max(flushes) << 20, dtype=torch.uint8)
    print(f"µs per op, median of {args.iters} (load {os.getloadavg()[0]:.1f}); columns: caches warm, then after "
          "a write over each flush size")
    print("| layer | warm | " + " | ".join(f"{f} MiB flushed" for f in flushes[1:]) + " |")
    print("|---|" + "---:|" * len(flushes))
    for name, fn in layers.items():
        cells = []
        for mib in flushes:
            flush = buf[: mib << 20]
            times = []
            for i in range(args.iters + 20):
                if mib:
                    flush.fill_(i & 255)
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            cells.append(f"{statistics.median(times[20:]) * 1e6:.1f}")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    traced.finalize()
    untraced.finalize()


if __name__ == "__main__":
    main()
