"""Time and scratch memory of the two ways fsdp2 can run FSDP's collectives on gloo, at the sizes
of one FSDP module's parameters (fsdp2.collectives.COPYING_ENGINES):

  all-gather      all_gather_single (gloo's _allgather_base: scratch tensors, then copied out)
                  vs all_gather_v into the output's chunks (one in-place broadcast per rank)
  reduce-scatter  reduce_scatter_single (gloo's _reduce_scatter_base: an all-reduce of a copy of
                  the input) vs an in-place all_reduce of the input and this rank's chunk copied

  python3 benchmarks/diagnostics/gloo_fsdp_paths.py --ranks 4 [--mib 15 3.75] [--reps 20]

Each op is issued async and waited, as fsdp2 does, the two paths alternating rep by rep; the
table shows the slowest rank's median milliseconds, the ratio, and the torch-allocated bytes
above the op's own buffers at the op's peak (benchmarks/alloc_peak.py). Times are only
meaningful on a host with a free core per rank and engine thread.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))


def worker(args: argparse.Namespace) -> None:
    import torch

    import torchcomms
    from benchmarks.alloc_peak import AllocationTrace, count_allocations
    from torchcomms import ReduceOp

    count_allocations()
    torch.set_num_threads(1)
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="paths")
    rank, size = comm.get_rank(), comm.get_size()
    out: dict[str, Any] = {}
    for mib in args.mib:
        numel = int(mib * 2**20 / 4) // size * size
        full, shard = torch.randn(numel), torch.randn(numel // size)

        def ag_single() -> None:
            comm.all_gather_single(full, full.view(size, -1)[rank], async_op=True).wait()

        def ag_chunks() -> None:
            comm.all_gather_v(list(full.chunk(size)), full.view(size, -1)[rank], async_op=True).wait()

        def rs_single() -> None:
            comm.reduce_scatter_single(shard, full, ReduceOp.SUM, async_op=True).wait()

        def rs_in_place() -> None:
            comm.all_reduce(full, ReduceOp.SUM, async_op=True).wait()
            shard.copy_(full.view(size, -1)[rank])

        paths: dict[str, Callable[[], None]] = {"all-gather single": ag_single, "all-gather chunks": ag_chunks,
                                                "reduce-scatter single": rs_single,
                                                "reduce-scatter in place": rs_in_place}
        times: dict[str, list[float]] = {k: [] for k in paths}
        scratch: dict[str, int] = {}
        for name, fn in paths.items():
            fn()  # warm
            with AllocationTrace() as t:
                fn()
            p = t.peak()
            scratch[name] = p.peak - p.start
        for _ in range(args.reps):
            for name, fn in paths.items():
                comm.barrier(async_op=False)
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        out[str(mib)] = {"times": times, "scratch": scratch}
    Path(args.out).write_text(json.dumps(out))
    comm.barrier(async_op=False)
    os._exit(0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--mib", type=float, nargs="+", default=[15.0, 3.75],
                   help="unsharded sizes (MiB of fp32): dim 512 and dim 256 Llama blocks")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    from benchmarks.fsdp_bench import free_port

    tmp, port = Path(tempfile.mkdtemp(prefix="gloo-paths-")), free_port()
    procs = []
    for r in range(args.ranks):
        env = dict(os.environ, TORCHCOMM_RANK=str(r), TORCHCOMM_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        env.pop("TORCHCOMM_CONTROL_ADDR", None)
        cmd = [sys.executable, __file__, "--worker", "--out", str(tmp / f"{r}.json"), "--reps", str(args.reps),
               "--mib", *map(str, args.mib)]
        procs.append(subprocess.Popen(cmd, env=env))
    if any(p.wait(timeout=900) for p in procs):
        raise SystemExit("a rank failed")
    res = [json.loads((tmp / f"{r}.json").read_text()) for r in range(args.ranks)]
    print(f"gloo_fsdp_paths: {args.ranks} ranks, {args.reps} reps, load {os.getloadavg()[0]:.1f}")
    print(f"{'MiB':>6} {'path':<24} {'ms':>8} {'vs single':>9} {'scratch MiB':>11}")
    for mib in map(str, args.mib):
        med = {k: max(statistics.median(r[mib]["times"][k]) for r in res) * 1e3 for k in res[0][mib]["times"]}
        scratch = {k: max(r[mib]["scratch"][k] for r in res) / 2**20 for k in med}
        for k, ms in med.items():
            base = med["all-gather single" if k.startswith("all-gather") else "reduce-scatter single"]
            print(f"{mib:>6} {k:<24} {ms:>8.2f} {ms / base:>9.3f} {scratch[k]:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
