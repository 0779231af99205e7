"""The MPI engine of ``comm_bench.py``: torchcomms on MPI vs bare mpi4py vs c10d gloo, one run.

    python3 benchmarks/comm_bench.py --engine mpi --ops all_reduce --min-bytes 1K --max-bytes 64M

The parent hosts a TCPStore (for c10d's gloo group) and starts the ranks as one MPI job
(``mpiexec -n N --oversubscribe``). Each rank has three contenders on the same buffers:
``torchcomms`` (``new_comm("mpi", cpu)``, the full dispatch path), ``mpi4py`` (the bare
blocking call on a duplicate of ``MPI_COMM_WORLD``: the floor) and ``c10d`` (gloo through
``init_process_group``: the anchor of the other comm_bench runs). Each sample is one contender
running ``inner`` back-to-back ops right after an MPI barrier (``inner`` grows as sizes shrink,
so that a 1 KiB op of a few µs is not lost in the barrier's skew), divided by ``inner``; the
contenders take turns in an order shuffled every iteration, and a sample's time is the slowest
rank's. Every contender first runs each op once on identical inputs, and the outputs must agree
exactly.

Goals (the issue's): bus bandwidth >= 4x gloo's at 16 MiB; <= 30 µs (and >= 20x below gloo)
at 1 KiB; within 1.10x of bare mpi4py at >= 1 MiB.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

BARE = "mpi4py"
OURS = "torchcomms"
#: ops per sample: enough that the sample lasts about this long at the bare MPI's speed
_SAMPLE_TARGET_BYTES = 4 << 20
_MAX_INNER = 64


def inner_for(nbytes: int) -> int:
    return max(1, min(_MAX_INNER, _SAMPLE_TARGET_BYTES // max(nbytes, 1)))


def bare_call(MPI: Any, comm: Any, op: str, inp: torch.Tensor, out: torch.Tensor) -> Callable[[], object]:  # noqa: N803
    """The blocking mpi4py call for ``op`` on the tensors' memory (numpy views: no copy)."""
    i, o = inp.numpy(), out.numpy()
    if op == "all_reduce":
        return lambda: comm.Allreduce(MPI.IN_PLACE, i, MPI.SUM)
    if op == "all_gather_single":
        return lambda: comm.Allgather(i, o)
    if op == "reduce_scatter_single":
        return lambda: comm.Reduce_scatter_block(i, o, MPI.SUM)
    if op == "all_to_all_single":
        return lambda: comm.Alltoall(i, o)
    return lambda: comm.Bcast(i, 0)


def run_rank(args: Any, cb: Any) -> None:
    """One rank of the MPI job (``cb`` is the comm_bench module: buffers, calls, contender names)."""
    import torchcomms

    os.environ["TORCHCOMM_TRACING_DISABLE"] = "0" if args.tracing == "on" else "1"
    hints = {} if args.mpi_nonblocking_max is None else {"mpi.nonblocking_max_bytes": str(args.mpi_nonblocking_max)}
    if args.mpi_collectives is not None:
        hints["mpi.collectives"] = args.mpi_collectives
    ours = torchcomms.new_comm("mpi", torch.device("cpu"), "bench-mpi", timeout=timedelta(seconds=args.op_timeout),
                               hints=hints)
    from mpi4py import MPI

    rank, n = ours.get_rank(), ours.get_size()
    bare = MPI.COMM_WORLD.Dup()
    bar = MPI.COMM_WORLD.Dup()
    cb.connect_rank(cb.engine_of(torch.device("cpu")), rank, n, args.op_timeout)  # c10d gloo: the anchor
    dtype = cb.DTYPES[args.dtype]
    names = [OURS, BARE, cb.ANCHOR]
    rows: list[dict[str, Any]] = []
    for op in args.ops:
        for size in args.sizes:
            bufs: dict[str, Any] = {}
            calls: dict[str, Callable[[], object]] = {}
            for name in names:
                bufs[name], nbytes = cb.make_buffers(op, size, n, rank, dtype)
                b = bufs[name]
                calls[name] = (cb.torchcomms_call(ours, op, b) if name == OURS else
                               bare_call(MPI, bare, op, b.inp, b.out) if name == BARE else cb.c10d_call(op, b))
            error = _check(names, bufs, calls, bar, cb.ANCHOR)
            if error is not None:
                rows.append({"op": op, "bytes": nbytes, "requested_bytes": size, "error": error})
                break
            inner = inner_for(nbytes)
            times: dict[str, list[float]] = {name: [] for name in names}
            order_rng = random.Random(f"{args.seed}/{op}/{size}")
            for it in range(args.warmup + args.iters):
                order = list(names)
                order_rng.shuffle(order)
                for name in order:
                    call = calls[name]
                    # c10d gloo at small sizes costs ~0.5 ms an op: one op a sample is plenty
                    k = 1 if name == cb.ANCHOR else inner
                    bar.Barrier()
                    t0 = time.perf_counter()
                    for _ in range(k):
                        call()
                    dt = (time.perf_counter() - t0) / k
                    if it >= args.warmup:
                        times[name].append(dt)
            local = torch.tensor([times[nm] for nm in names], dtype=torch.float64)
            slowest = torch.empty_like(local)
            bar.Allreduce(local.numpy(), slowest.numpy(), MPI.MAX)
            rows.append({"op": op, "bytes": nbytes, "requested_bytes": size, "inner": inner,
                         "samples_s": {nm: slowest[i].tolist() for i, nm in enumerate(names)}})
            if rank == 0 and args.verbose:
                print(f"  rank0: {op} {cb.fmt_bytes(size)} done", file=sys.stderr, flush=True)
    if rank == 0:
        Path(args.rank_result).write_text(json.dumps(rows))
    bar.Barrier()
    ours.finalize()
    dist.destroy_process_group()


def _check(names: list[str], bufs: dict[str, Any], calls: dict[str, Callable[[], object]], bar: Any,
           anchor: str) -> str | None:
    """Every contender once on identical inputs; outputs must be identical on every rank."""
    from mpi4py import MPI

    error = None
    for name in names:
        bar.Barrier()
        try:
            calls[name]()
        except Exception as e:  # noqa: BLE001 - reported in the table, not hidden
            error = error or f"{name}: {type(e).__name__}: {e}"
    ref = bufs[anchor].out
    for name in names:
        if error is None and not torch.equal(bufs[name].out, ref):
            error = f"{name}: output differs from c10d's on the same input"
    failed = bar.allreduce(0 if error is None else 1, op=MPI.MAX)
    return None if not failed else (error or "failed on another rank")


def launch(args: Any, result_path: Path, script: Path, cb: Any) -> None:
    """Host the store, start the MPI job, wait for it; it never outlives this call."""
    import shutil
    import tempfile

    from tests.helpers.mpi_ranks import mpiexec, mpiexec_env

    server = cb.host_store(args.nproc)
    job_dir = Path(tempfile.mkdtemp(prefix="tc-cb-mpi-"))
    env = mpiexec_env(cb.rank_env(args, server.port), job_dir)
    cmd = [mpiexec() or "mpiexec", "-n", str(args.nproc), "--oversubscribe", sys.executable, str(script),
           "--_rank-result", str(result_path), *args.argv]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        rc = proc.wait(args.deadline)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"comm_bench: the MPI job ran past --deadline {args.deadline} s") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        shutil.rmtree(job_dir, ignore_errors=True)
    if rc != 0:
        raise RuntimeError(f"comm_bench: the MPI job failed (mpiexec exit code {rc})")


def goals(results: list[dict[str, Any]], anchor: str) -> list[str]:
    """One line per goal of the issue, with the figure measured in this run."""
    lines = []
    for res in results:
        c = res.get("contenders")
        if not c or res["op"] != "all_reduce":
            continue
        ours, bare, gloo = c[OURS], c[BARE], c[anchor]
        size = res["bytes"]
        if size == 16 << 20:
            ratio = ours["busbw_GBps"] / gloo["busbw_GBps"]
            lines.append(f"busbw at 16 MiB: {ours['busbw_GBps']:.3g} GB/s = {ratio:.2f}x gloo's "
                         f"{gloo['busbw_GBps']:.3g} (goal >= 4x: {'met' if ratio >= 4 else 'NOT met'})")
        if size == 1 << 10:
            ok = ours["time_us"] <= 30 and gloo["time_us"] / ours["time_us"] >= 20
            lines.append(f"latency at 1 KiB: {ours['time_us']:.1f} µs vs gloo {gloo['time_us']:.0f} µs "
                         f"({gloo['time_us'] / ours['time_us']:.0f}x lower), bare mpi4py {bare['time_us']:.1f} µs "
                         f"(goal <= 30 µs and >= 20x: {'met' if ok else 'NOT met'})")
        if size >= 1 << 20:
            ratio = ours["time_us"] / bare["time_us"]
            lines.append(f"vs bare mpi4py at {size >> 20} MiB: {ours['time_us']:.0f} / {bare['time_us']:.0f} µs = "
                         f"{ratio:.3f} (pair {ours.get('pair_bare', float('nan')):.3f}; goal <= 1.10: "
                         f"{'met' if ratio <= 1.10 else 'NOT met'})")
    return lines


def add_bare_ratios(results: list[dict[str, Any]], raw: list[dict[str, Any]]) -> None:
    """``pair_bare``: the median per-iteration ratio torchcomms / bare mpi4py."""
    import statistics

    for res, row in zip(results, raw):
        if "samples_s" in row:
            pairs = [a / b for a, b in zip(row["samples_s"][OURS], row["samples_s"][BARE])]
            res["contenders"][OURS]["pair_bare"] = statistics.median(pairs)
            res["inner"] = row.get("inner")
