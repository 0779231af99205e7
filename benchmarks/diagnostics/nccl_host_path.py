"""Host cost per op of the nccl backend, broken down into its parts (explains the host column
of ``comm_bench.py --device cuda``).

    python3 benchmarks/diagnostics/nccl_host_path.py --device cpu   # stand-in engine, no GPU
    python3 benchmarks/diagnostics/nccl_host_path.py --device cuda  # ProcessGroupNCCL on cuda:0

Each row is a zero-argument call issued ``--burst`` times back to back (the GPU, if any, is
synchronized before and after the burst, outside the timed region), in ``--rounds`` rounds of
shuffled order. Columns: wall µs per call (median over rounds), the issuing thread's CPU µs per call
during the burst, and CPU µs per call of the whole process over the burst *and* the drain after it (every thread: the completion poller's
work is in it; robust to a loaded machine, where wall time measures the scheduler), and the
process's voluntary context switches per call during the burst (each is a thread giving up
the CPU: mostly the GIL passing between the issuing thread and the completion poller).

``--device cpu`` runs ``NcclBackend`` on a stand-in for ``ProcessGroupNCCL`` whose calls do no
work and whose works complete ``--gpu-us`` after issue: what is left is torchcomms' own Python
(dispatch, record, work, watchdog, poller, tracing). ``--device cuda`` adds c10d's pieces on a
real engine: ``dist.all_reduce`` (the anchor), ``pg.allreduce`` on the current stream
(``asyncOp=False``) and on the engine's stream plus ``Work.wait``, a CUDA event record, and
the Python of ``dist.all_reduce`` around its engine call.
"""
from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import os
import pstats
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import torchcomms  # noqa: E402
from torchcomms import ReduceOp  # noqa: E402
from torchcomms.backends.base import BackendCapabilities  # noqa: E402
from torchcomms.backends import nccl  # noqa: E402
from torchcomms.backends.nccl import NcclBackend  # noqa: E402
from torchcomms.backends.nccl_completion import CompletionPoller  # noqa: E402


class StandInWork:
    """A ``c10d.Work`` stand-in: complete ``gpu_s`` after it was made."""

    __slots__ = ("_done_at",)

    def __init__(self, gpu_s: float) -> None:
        self._done_at = time.perf_counter() + gpu_s

    def is_completed(self) -> bool:
        return time.perf_counter() >= self._done_at

    def wait(self, timeout: Any = None) -> bool:
        return True

    def block_current_stream(self) -> None:
        return None

    def _get_duration(self) -> float:
        return 0.001


_BLOB = bytes(4096)  # hashlib releases the GIL while it hashes 2 KiB or more


class _ErrorType:
    name = "SUCCESS"  # what ProcessGroupNCCL.get_error() names while the communicator is healthy


_SUCCESS = _ErrorType()


class StandInEngine:
    """The part of ``ProcessGroupNCCL`` the backend's all-reduce and teardown use."""

    def __init__(self, gpu_s: float) -> None:
        self.gpu_s = gpu_s

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> StandInWork:
        hashlib.sha1(_BLOB)  # c10d's binding releases the GIL around the engine call: so does this (no syscall)
        return StandInWork(self.gpu_s)

    def get_error(self) -> Any:
        return _SUCCESS

    def shutdown(self) -> None:
        return None

    abort = shutdown


class StandInNccl(NcclBackend):
    """``NcclBackend`` with the stand-in engine, on CPU tensors."""

    backend_name = "nccl-standin"
    capabilities = BackendCapabilities(devices=("cpu",), abort=True, shrink=False, split=False)
    gpu_s = 20e-6

    @classmethod
    def is_available(cls) -> bool:
        return True

    @classmethod
    def needs_store(cls, size: int) -> bool:
        return False

    def init(self, split_from: Any = None, exclude: Any = None) -> None:
        self._device = self.ctx.device
        self._pg = StandInEngine(self.gpu_s)
        self._aborted = False
        self._barrier_buf = None
        self._opts = {}
        timing = getattr(nccl, "_timing_wanted", None)  # as the real engine: timed where traced
        self._timed = timing is not None and timing(self.ctx.hints)
        self._poller = CompletionPoller(self.ctx.name, self._engine_error)


def new_comm(backend: str, device: torch.device, name: str, tracing: bool, hints: dict[str, str]) -> Any:
    saved = os.environ.get("TORCHCOMM_TRACING_DISABLE")
    os.environ["TORCHCOMM_TRACING_DISABLE"] = "0" if tracing else "1"
    try:
        return torchcomms.new_comm(backend, device, name=name, timeout=timedelta(seconds=600),
                                   hints={"rank": "0", "size": "1", **hints})
    finally:
        if saved is None:
            del os.environ["TORCHCOMM_TRACING_DISABLE"]
        else:
            os.environ["TORCHCOMM_TRACING_DISABLE"] = saved


def build(args: argparse.Namespace) -> tuple[dict[str, Callable[[], object]], list[Any], Callable[[], None]]:
    """Rows (name -> call), the communicators to finalize, and the drain run after each burst."""
    rows: dict[str, Callable[[], object]] = {}
    if args.device == "cpu":
        StandInNccl.gpu_s = args.gpu_us * 1e-6
        torchcomms.register_backend(StandInNccl.backend_name, StandInNccl)
        device, backend = torch.device("cpu"), StandInNccl.backend_name
        t = torch.zeros(args.numel)
        engine = StandInEngine(StandInNccl.gpu_s)
        opts = dist.AllreduceOptions()
        rows["engine call alone (stand-in: no work)"] = lambda: engine.allreduce([t], opts)
    else:
        device, backend = torch.device("cuda", 0), "nccl"
        torch.cuda.set_device(device)
        t = torch.zeros(args.numel, device=device)
        store = dist.HashStore()
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
        pg = dist.distributed_c10d._get_default_group()._get_backend(device)
        sync_opts = dist.AllreduceOptions()
        if hasattr(sync_opts, "asyncOp"):
            sync_opts.asyncOp = False
        async_opts = dist.AllreduceOptions()
        rows["c10d dist.all_reduce (anchor)"] = lambda: dist.all_reduce(t)
        rows["c10d pg.allreduce, current stream (asyncOp=False)"] = lambda: pg.allreduce([t], sync_opts)
        rows["c10d pg.allreduce, engine stream + Work.wait"] = lambda: pg.allreduce([t], async_opts).wait()
        rows["c10d pg.allreduce, engine stream, no wait"] = lambda: pg.allreduce([t], async_opts)
        ev = torch.cuda.Event(enable_timing=True)
        rows["torch.cuda.Event.record (timing)"] = lambda: ev.record()
        rows["AllreduceOptions()"] = lambda: dist.AllreduceOptions()
        rows["torch.cuda.current_stream()"] = lambda: torch.cuda.current_stream()
        rows["torch.cuda.Event() + record"] = lambda: torch.cuda.Event().record()
        rows["torch.Event(cuda) + record"] = lambda: torch.Event(device).record()
        tev = torch.Event(device)
        tev.record()
        rows["torch.Event.record (reused)"] = lambda: tev.record()
        rows["torch.Event.wait (current stream)"] = lambda: tev.wait()
        rows["torch.Event.query"] = lambda: tev.query()
    comms = []
    # traced: the default tracing, which turns the engine's per-op event timing on; "traced, no
    # timing" shows what the timing costs
    for label, tracing, hints in (("untraced", False, {}), ("traced", True, {}),
                                  ("traced, no timing", True, {"nccl.timing": "0"})):
        comm = new_comm(backend, device, f"host-path-{label.replace(', ', '-').replace(' ', '-')}", tracing, hints)
        comms.append(comm)
        rows[f"ours sync, {label}"] = (lambda c: lambda: c.all_reduce(t, ReduceOp.SUM, False))(comm)
        if label in ("untraced", "traced"):
            rows[f"ours async+wait, {label}"] = (lambda c: lambda: c.all_reduce(t, ReduceOp.SUM, True).wait())(comm)

    def drain() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()
        for c in comms:  # every op retired: the poller's work for this burst is done
            c.all_reduce(t, ReduceOp.SUM, True).wait_blocking()

    return rows, comms, drain


def measure(rows: dict[str, Callable[[], object]], drain: Callable[[], None], rounds: int, burst: int,
            seed: int) -> dict[str, dict[str, list[float]]]:
    rng = random.Random(seed)
    out: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": [], "thread_cpu": [], "switches": []} for n in rows}
    for call in rows.values():  # warm-up: first-call costs stay out
        for _ in range(max(10, burst // 5)):
            call()
        drain()
    for _ in range(rounds):
        order = list(rows)
        rng.shuffle(order)
        for name in order:
            call = rows[name]
            drain()
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            c0 = time.process_time()
            m0 = time.thread_time()
            t0 = time.perf_counter()
            for _ in range(burst):
                call()
            t1 = time.perf_counter()
            m1 = time.thread_time()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            drain()
            c1 = time.process_time()
            out[name]["thread_cpu"].append((m1 - m0) / burst * 1e6)
            out[name]["switches"].append((r1.ru_nvcsw - r0.ru_nvcsw) / burst)
            out[name]["wall"].append((t1 - t0) / burst * 1e6)
            out[name]["cpu"].append((c1 - c0) / burst * 1e6)
    return out


def profile(call: Callable[[], object], calls: int, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--burst", type=int, default=200, help="calls per timed burst (default 200)")
    p.add_argument("--numel", type=int, default=1024)
    p.add_argument("--gpu-us", type=float, default=20.0, help="--device cpu: the stand-in op's duration")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile 'ours sync', untraced and traced; top N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    started = datetime.now(timezone.utc)
    load = os.getloadavg()
    rows, comms, drain = build(args)
    res = measure(rows, drain, args.rounds, args.burst, args.seed)
    print(f"nccl_host_path --device {args.device}: all_reduce of {args.numel} float32, {args.rounds} rounds x "
          f"{args.burst} calls; {started:%Y-%m-%d %H:%M} UTC, load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}, "
          f"torch {torch.__version__}")
    print("| call | wall µs/call (median) | wall best round | issuing thread CPU µs/call | process CPU µs/call "
          "(with the drain) | thread switches/call |")
    print("|---|---:|---:|---:|---:|---:|")
    summary = {}
    for name, r in res.items():
        summary[name] = {"wall_us": statistics.median(r["wall"]), "wall_best_us": min(r["wall"]),
                         "thread_cpu_us": statistics.median(r["thread_cpu"]), "cpu_us": statistics.median(r["cpu"]),
                         "switches": statistics.median(r["switches"])}
        s = summary[name]
        print(f"| {name} | {s['wall_us']:.1f} | {s['wall_best_us']:.1f} | {s['thread_cpu_us']:.1f} | {s['cpu_us']:.1f} | "
              f"{s['switches']:.2f} |")
    if args.profile:
        for name in ("ours sync, untraced", "ours sync, traced"):
            print(f"cProfile of {name!r}, 5000 calls:")
            print(profile(rows[name], 5000, args.profile))
    for c in comms:
        c.finalize()
    if args.json:
        Path(args.json).write_text(json.dumps({"date": started.isoformat(timespec="seconds"), "load": load,
                                               "args": vars(args), "summary": summary, "samples": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
