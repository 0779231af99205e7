"""Where the mpi engine's time goes on a large all_reduce, one layer at a time (2+ ranks under
``mpiexec``, float32, in place, each layer on its own buffer, interleaved every iteration;
the slowest rank's median):

- ``bare``: mpi4py's blocking ``Allreduce`` on the caller's thread (the floor);
- ``nb``: mpi4py's nonblocking ``Iallreduce`` polled by ``Test`` in a tight loop (the floor of
  the nonblocking path);
- ``nbwait``: the same, polled by the backend's ``blocking_wait`` (its yields and clock checks);
- ``thread``: the same call on a second thread, handed over and back with two locks;
- ``job``: the same call as a job of the communicator's engine thread (``EngineThread``);
- ``backend``: the backend's ``all_reduce`` and ``EngineHandle.wait_until`` (no dispatch path);
- ``ours``: ``TorchComm.all_reduce`` (the whole dispatch path).

Also prints the caller thread's CPU time per op (``time.thread_time``) of each layer.

    mpiexec -n 2 --oversubscribe python3 benchmarks/diagnostics/mpi_op_layers.py --sizes-mib 1,4,16
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import torchcomms  # noqa: E402
from torchcomms import ReduceOp  # noqa: E402


def layers(comm: torchcomms.TorchComm, nbytes: int) -> dict[str, Callable[[], object]]:
    from mpi4py import MPI

    backend = comm._core.backend  # noqa: SLF001 - a diagnostic of the layers below the API
    from torchcomms.backends.mpi.progress import blocking_wait

    names = ("bare", "nb", "nbwait", "thread", "job", "backend", "ours")
    bufs = {k: torch.randint(-8, 8, (nbytes // 4,)).float() for k in names}
    bare = MPI.COMM_WORLD.Dup()
    bare_np, thread_np = bufs["bare"].numpy(), bufs["thread"].numpy()
    go, done = threading.Lock(), threading.Lock()
    go.acquire()
    done.acquire()

    def second_thread() -> None:
        while True:
            go.acquire()
            bare.Allreduce(MPI.IN_PLACE, thread_np, MPI.SUM)
            done.release()

    threading.Thread(target=second_thread, daemon=True).start()
    total = ReduceOp.SUM
    backend.all_reduce(bufs["backend"], total).wait_until(time.monotonic() + 60)  # may start the engine thread
    if backend._thread is None:  # noqa: SLF001 - the large collectives do not use it (hint or default)
        from torchcomms.backends.mpi.engine_thread import EngineThread

        backend._thread = EngineThread("op-layers", backend._on_error, MPI.Exception)  # noqa: SLF001
    spec, mop = backend._buf.spec(bufs["job"]), backend._buf.op(total.type, torch.float32)  # noqa: SLF001

    def handed_over() -> None:
        go.release()
        done.acquire()

    def engine_job() -> None:
        backend._thread.submit(lambda: backend._comm.Allreduce(MPI.IN_PLACE, spec, mop), bufs["job"]).wait(60)  # noqa: SLF001

    def backend_only() -> None:
        backend.all_reduce(bufs["backend"], total).wait_until(time.monotonic() + 60)

    nb_np, nbwait_np = bufs["nb"].numpy(), bufs["nbwait"].numpy()

    def nonblocking() -> None:
        req = bare.Iallreduce(MPI.IN_PLACE, nb_np, MPI.SUM)
        while not req.Test():
            pass

    def nonblocking_our_wait() -> None:
        req = bare.Iallreduce(MPI.IN_PLACE, nbwait_np, MPI.SUM)
        blocking_wait(MPI, [req], lambda e: e)(60.0)

    return {"bare": lambda: bare.Allreduce(MPI.IN_PLACE, bare_np, MPI.SUM), "nb": nonblocking,
            "nbwait": nonblocking_our_wait, "thread": handed_over,
            "job": engine_job, "backend": backend_only, "ours": lambda: comm.all_reduce(bufs["ours"], total, False)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mib", default="1,4,16")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--tracing", choices=("on", "off"), default="off")
    p.add_argument("--nonblocking-max", type=int, default=None, help="hint mpi.nonblocking_max_bytes")
    args = p.parse_args()
    os.environ["TORCHCOMM_TRACING_DISABLE"] = "0" if args.tracing == "on" else "1"
    hints = {} if args.nonblocking_max is None else {"mpi.nonblocking_max_bytes": str(args.nonblocking_max)}
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "op-layers", timeout=timedelta(seconds=60), hints=hints)
    from mpi4py import MPI

    bar = MPI.COMM_WORLD.Dup()
    for mib in (float(s) for s in args.sizes_mib.split(",")):
        fns = layers(comm, int(mib * (1 << 20)))
        wall: dict[str, list[float]] = {k: [] for k in fns}
        cpu: dict[str, list[float]] = {k: [] for k in fns}
        for it in range(args.iters + 5):
            for k, fn in fns.items():
                bar.Barrier()
                c0, t0 = time.thread_time(), time.perf_counter()
                fn()
                if it >= 5:
                    wall[k].append(time.perf_counter() - t0)
                    cpu[k].append(time.thread_time() - c0)
        local = torch.tensor([wall[k] for k in fns], dtype=torch.float64)
        slowest = torch.empty_like(local)
        bar.Allreduce(local.numpy(), slowest.numpy(), MPI.MAX)
        if bar.Get_rank() == 0:
            med = {k: statistics.median(slowest[i].tolist()) * 1e6 for i, k in enumerate(fns)}
            print(f"{mib:g} MiB (tracing {args.tracing}, load {os.getloadavg()[0]:.1f}): "
                  + ", ".join(f"{k} {v:.0f} us ({v / med['bare']:.2f})" for k, v in med.items())
                  + " | caller CPU " + ", ".join(f"{k} {statistics.median(cpu[k]) * 1e6:.0f}" for k in fns), flush=True)
    comm.finalize()


if __name__ == "__main__":
    main()
