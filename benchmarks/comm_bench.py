"""nccl-tests-style collective sweep: torchcomms vs c10d on the same engine (gloo), one run;
with ``--engine mpi``, torchcomms on MPI vs bare mpi4py vs c10d gloo (see comm_bench_mpi.py).

    python3 benchmarks/comm_bench.py                       # 2 ranks, 4 KiB .. 64 MiB, x4 steps
    python3 benchmarks/comm_bench.py --tracing both        # also torchcomms without tracing
    python3 benchmarks/comm_bench.py --control             # plus an A/A control (c10d vs c10d)
    python3 benchmarks/comm_bench.py --ops all_reduce --min-bytes 16M --max-bytes 64M --json out.json
    python3 benchmarks/comm_bench.py --device cuda --nproc 1   # nccl on one GPU per rank
    python3 benchmarks/comm_bench.py --engine mpi --ops all_reduce --min-bytes 1K --max-bytes 64M

With ``--device cuda`` both contenders run NCCL (torchcomms' ``nccl`` backend and c10d's
``ProcessGroupNCCL``) on ``cuda:LOCAL_RANK``; an op's time then runs from its call until
``torch.cuda.synchronize()`` returns, and ``host µs`` is the host time per call of a burst of
``--host-burst`` calls issued back to back without synchronizing (the host overhead per op).

The parent process hosts a TCPStore (port 0, so no fixed port) and starts ``--nproc`` rank
processes. Each rank creates, over that store, a torchcomms communicator
(``torchcomms.new_comm("gloo", cpu, ...)``), c10d's default group
(``torch.distributed.init_process_group("gloo", ...)``) and a third gloo group used only for
the barriers, so neither contender's sockets are warmed by them.

For each (op, size) the contenders run interleaved: every iteration times one op of each
contender back to back, in an order shuffled every iteration (the same seeded order on every
rank), so no contender always goes first or always follows the same one; each op is preceded
by a barrier so the ranks start it together. An op's time on an iteration is the
slowest rank's; the table shows the median over iterations. Before timing, every contender
runs the op once on the same input and the outputs must agree exactly.

``size`` follows nccl-tests: the bytes of the largest buffer (all_gather: the output;
reduce_scatter: the input). algbw = size / time; busbw = algbw x 2(n-1)/n for all_reduce,
x (n-1)/n for all_gather, reduce_scatter and all_to_all, x 1 for broadcast.
``ratio`` = torchcomms median / c10d median (< 1: torchcomms is faster); ``pair`` is the
median of the per-iteration ratios, which cancels slow phases of a noisy machine. With
``--control`` a second c10d group runs the same calls: its "A/A" ratio is the spread that
identical engines show on this machine in this run, the yardstick for the other ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

OPS = ("all_reduce", "all_gather_single", "reduce_scatter_single", "all_to_all_single", "broadcast")
ANCHOR = "c10d"
CONTROL = "c10d-again"  # A/A control: the same c10d calls on a second gloo group
TRACED = "torchcomms"
UNTRACED = "torchcomms-notrace"
RATIO_LABELS = {TRACED: "", UNTRACED: " (notrace)", CONTROL: " (A/A)", "mpi4py": " (bare mpi4py)"}
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "int64": torch.int64}


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor for ``op`` on ``n`` ranks."""
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    return (n - 1) / n


def parse_bytes(text: str) -> int:
    """``4096``, ``4K``, ``4KiB``, ``16M``, ``1G`` (binary units) -> bytes."""
    s = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    digits = s[:-1] if mult > 1 else s
    try:
        value = int(digits) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (use e.g. 4096, 4K, 16M)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"byte size must be positive, got {text!r}")
    return value


def size_sweep(lo: int, hi: int, factor: int) -> list[int]:
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= factor
    return sizes


def fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


# ------------------------------------------------------------------------------------------
# rank side
@dataclass
class Buffers:
    """One contender's input/output for one (op, size)."""

    inp: torch.Tensor
    out: torch.Tensor


def make_buffers(op: str, size: int, n: int, rank: int, dtype: torch.dtype,
                 device: torch.device | None = None) -> tuple[Buffers, int]:
    """Buffers for ``op`` whose largest one holds ``size`` bytes (rounded down to whole
    elements divisible by ``n``); returns them and the effective byte size."""
    esize = torch.empty((), dtype=dtype).element_size()
    count = max(n, (size // esize) // n * n)
    gen = torch.Generator().manual_seed(1234 + rank)
    full = torch.randint(-8, 8, (count,), generator=gen).to(dtype)
    if device is not None:
        full = full.to(device)
    dev = full.device
    if op == "all_gather_single":
        return Buffers(full[: count // n].clone(), torch.empty(count, dtype=dtype, device=dev)), count * esize
    if op == "reduce_scatter_single":
        return Buffers(full, torch.empty(count // n, dtype=dtype, device=dev)), count * esize
    if op == "all_to_all_single":
        return Buffers(full, torch.empty(count, dtype=dtype, device=dev)), count * esize
    return Buffers(full, full), count * esize  # all_reduce, broadcast: in place


def torchcomms_call(comm: Any, op: str, b: Buffers) -> Callable[[], object]:
    from torchcomms import ReduceOp

    if op == "all_reduce":
        return lambda: comm.all_reduce(b.inp, ReduceOp.SUM, False)
    if op == "all_gather_single":
        return lambda: comm.all_gather_single(b.out, b.inp, False)
    if op == "reduce_scatter_single":
        return lambda: comm.reduce_scatter_single(b.out, b.inp, ReduceOp.SUM, False)
    if op == "all_to_all_single":
        return lambda: comm.all_to_all_single(b.out, b.inp, False)
    return lambda: comm.broadcast(b.inp, 0, False)


# torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to *_single and keeps the
# old names as deprecated wrappers; call the direct function wherever it exists (2.11 has only
# the old names).
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def c10d_call(op: str, b: Buffers, group: Any = None) -> Callable[[], object]:
    if op == "all_reduce":
        return lambda: dist.all_reduce(b.inp, group=group)
    if op == "all_gather_single":
        return lambda: _ALL_GATHER(b.out, b.inp, group=group)
    if op == "reduce_scatter_single":
        return lambda: _REDUCE_SCATTER(b.out, b.inp, group=group)
    if op == "all_to_all_single":
        return lambda: dist.all_to_all_single(b.out, b.inp, group=group)
    return lambda: dist.broadcast(b.inp, src=0, group=group)


def engine_of(device: torch.device) -> str:
    """The engine both contenders run on ``device``."""
    return "nccl" if device.type == "cuda" else "gloo"


def new_torchcomm(name: str, store: Any, tracing: bool, device: torch.device = torch.device("cpu")) -> Any:
    """A communicator on ``device``'s engine; tracing is decided by TORCHCOMM_TRACING_DISABLE
    at creation."""
    import torchcomms

    saved = os.environ.get("TORCHCOMM_TRACING_DISABLE")
    os.environ["TORCHCOMM_TRACING_DISABLE"] = "0" if tracing else "1"
    try:
        return torchcomms.new_comm(engine_of(device), device, name=name, store=dist.PrefixStore(name, store))
    finally:
        if saved is None:
            del os.environ["TORCHCOMM_TRACING_DISABLE"]
        else:
            os.environ["TORCHCOMM_TRACING_DISABLE"] = saved


class Contenders:
    """The torchcomms communicators under test, ``engines`` per label; rebuilt under fresh
    names after an op failure broke them (a broken communicator fails every later op by design)."""

    def __init__(self, tracing: str, store: Any, engines: int = 1, device: torch.device = torch.device("cpu")) -> None:
        self._store = store
        self._device = device
        self._engines = engines
        self._which = [(TRACED, True)] if tracing in ("on", "both") else []
        self._which += [(UNTRACED, False)] if tracing in ("off", "both") else []
        self._generation = 0
        self.comms: dict[str, list[Any]] = {}
        self._build()

    def _build(self) -> None:
        g = self._generation
        self.comms = {
            label: [new_torchcomm(f"bench-{label}-{g}-{i}", self._store, tracing=on, device=self._device)
                    for i in range(self._engines)]
            for label, on in self._which
        }

    def rebuild(self) -> None:
        self.finalize()
        self._generation += 1
        self._build()

    def finalize(self) -> None:
        for comms in self.comms.values():
            for comm in comms:
                comm.finalize()


def run_rank(args: argparse.Namespace) -> None:
    rank, n = int(os.environ["TORCHCOMM_RANK"]), int(os.environ["TORCHCOMM_SIZE"])
    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", rank))) if args.device == "cuda" else None
    engine = engine_of(device or torch.device("cpu"))
    if device is not None:
        torch.cuda.set_device(device)
    store = connect_rank(engine, rank, n, args.op_timeout, device)
    bar = dist.new_group(backend="gloo")
    # --engines K: every contender owns K engines (gloo contexts, each with its own sockets) and
    # iteration i uses engine i % K, so that one engine's luck with its connections does not
    # decide a contender's time.
    anchors: list[Any] = [None] + [dist.new_group(backend=engine) for _ in range(args.engines - 1)]
    controls = [dist.new_group(backend=engine) for _ in range(args.engines)] if args.control else None
    ours = Contenders(args.tracing, store, args.engines, device or torch.device("cpu"))
    sync = torch.cuda.synchronize if device is not None else (lambda: None)
    dtype = DTYPES[args.dtype]
    rows: list[dict[str, Any]] = []
    for op in args.ops:
        for size in args.sizes:
            names = [*ours.comms, *([CONTROL] if controls is not None else []), ANCHOR]
            bufs: dict[str, Buffers] = {}
            engines: dict[str, list[Callable[[], object]]] = {}
            for name in names:
                bufs[name], nbytes = make_buffers(op, size, n, rank, dtype, device)
                if name == ANCHOR:
                    engines[name] = [c10d_call(op, bufs[name], grp) for grp in anchors]
                elif name == CONTROL:
                    engines[name] = [c10d_call(op, bufs[name], grp) for grp in controls or []]
                else:
                    engines[name] = [torchcomms_call(comm, op, bufs[name]) for comm in ours.comms[name]]
            error = None
            for k in range(args.engines):
                error = error or check_agreement(op, names, bufs, {nm: engines[nm][k] for nm in names}, bar, sync)
            error = agreed_error(error, bar)
            if error is not None:  # record it, skip this op's larger sizes, carry on with the next op
                rows.append({"op": op, "bytes": nbytes, "requested_bytes": size, "error": error})
                ours.rebuild()
                break
            times: dict[str, list[float]] = {name: [] for name in names}
            # every rank draws the same order (same seed), so the ranks issue the same ops
            order_rng = random.Random(f"{args.seed}/{op}/{size}")
            for it in range(args.warmup + args.iters):
                order = list(names)
                order_rng.shuffle(order)
                for name in order:
                    dist.barrier(group=bar)
                    call = engines[name][it % args.engines]
                    t0 = time.perf_counter()
                    call()
                    sync()
                    dt = time.perf_counter() - t0
                    if it >= args.warmup:
                        times[name].append(dt)
            # the op's time per iteration is its slowest rank's
            local = torch.tensor([times[nm] for nm in names], dtype=torch.float64)
            everyone = torch.empty(n * local.numel(), dtype=torch.float64)
            _ALL_GATHER(everyone, local.reshape(-1), group=bar)
            slowest = everyone.view(n, *local.shape).amax(dim=0)
            rows.append({"op": op, "bytes": nbytes, "requested_bytes": size,
                         "samples_s": {nm: slowest[i].tolist() for i, nm in enumerate(names)}})
            if device is not None:
                rows[-1]["host_s"] = host_overhead(names, engines, args.host_burst, bar, sync)
            if rank == 0 and args.verbose:
                print(f"  rank0: {op} {fmt_bytes(size)} done", file=sys.stderr, flush=True)
    if rank == 0:
        Path(args.rank_result).write_text(json.dumps(rows))
    dist.barrier(group=bar)
    ours.finalize()
    dist.destroy_process_group()


def host_overhead(names: list[str], engines: dict[str, list[Callable[[], object]]], burst: int, bar: Any,
                  sync: Callable[[], None]) -> dict[str, float]:
    """Host seconds per call of ``burst`` calls issued back to back (no synchronization
    between them), each contender in turn, the median of three bursts."""
    out: dict[str, float] = {}
    for name in names:
        call = engines[name][0]
        per_call = []
        for _ in range(3):
            sync()
            dist.barrier(group=bar)
            t0 = time.perf_counter()
            for _ in range(burst):
                call()
            per_call.append((time.perf_counter() - t0) / burst)
            sync()
        out[name] = statistics.median(per_call)
    return out


def check_agreement(op: str, names: list[str], bufs: dict[str, Buffers], calls: dict[str, Callable[[], object]],
                    bar: Any, sync: Callable[[], None] = lambda: None) -> str | None:
    """Run each contender once on identical inputs; their outputs must be identical.
    Returns what went wrong on this rank, or None."""
    for name in names:
        dist.barrier(group=bar)
        try:
            calls[name]()
            sync()
        except Exception as e:  # noqa: BLE001 - reported in the table, not hidden
            return f"{name}: {type(e).__name__}: {e}"
    ref = bufs[ANCHOR].out
    for name in names:
        if not torch.equal(bufs[name].out, ref):
            return f"{name}: output differs from c10d's on the same input"
    return None


def agreed_error(error: str | None, bar: Any) -> str | None:
    """Every rank learns whether any rank failed (so all skip together)."""
    flag = torch.tensor([0 if error is None else 1])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=bar)
    if flag.item() == 0:
        return None
    return error or "failed on another rank"


# ------------------------------------------------------------------------------------------
# rank set-up, shared by both engines (comm_bench_mpi.py uses these too)
#: variables of another launcher (or torch's torchcomms routing) that must not reach a rank
_FOREIGN = ("TORCHCOMM_RANK", "TORCHCOMM_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCH_DISTRIBUTED_USE_TORCHCOMMS")


def host_store(nproc: int) -> Any:
    """The parent's TCPStore that the ranks rendezvous through (port 0: no fixed port)."""
    return dist.TCPStore("127.0.0.1", 0, nproc, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=120))


def rank_env(args: argparse.Namespace, port: int, **extra: str) -> dict[str, str]:
    """A rank's environment: the parent's without ``_FOREIGN`` (c10d must be plain c10d here),
    the store's address, the gloo interface, this repository on the path, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=args.iface,
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), **extra)
    return env


def connect_rank(engine: str, rank: int, n: int, op_timeout: float, device: torch.device | None = None) -> Any:
    """This rank's client of the parent's store, and c10d's default group on ``engine`` over it."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), n, is_master=False,
                          timeout=timedelta(seconds=120))
    dist.init_process_group(engine, store=dist.PrefixStore("c10d", store), rank=rank, world_size=n,
                            timeout=timedelta(seconds=op_timeout), device_id=device)
    return store


# ------------------------------------------------------------------------------------------
# parent side
def launch(args: argparse.Namespace, result_path: Path) -> None:
    """Host the store, start the ranks, wait for them; no rank outlives this call."""
    server = host_store(args.nproc)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for r in range(args.nproc):
            env = rank_env(args, server.port, TORCHCOMM_RANK=str(r), TORCHCOMM_SIZE=str(args.nproc), RANK=str(r),
                           WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(r))
            cmd = [sys.executable, str(Path(__file__).resolve()), "--_rank-result", str(result_path), *args.argv]
            procs.append(subprocess.Popen(cmd, env=env))
        deadline = time.monotonic() + args.deadline
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                why = f"rank exited with {failed[0].returncode}" if failed else f"ran past --deadline {args.deadline} s"
                raise RuntimeError(f"comm_bench: {why}")
            time.sleep(0.05)
        bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
        if bad:
            raise RuntimeError(f"comm_bench: ranks failed (rank, exit code): {bad}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def bootstrap_median_ci(values: list[float], resamples: int = 2000, level: float = 0.95,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the median of ``values``."""
    rng = random.Random(seed)
    k = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=k)) for _ in range(resamples))
    lo = meds[int((1 - level) / 2 * (resamples - 1))]
    hi = meds[int((1 + level) / 2 * (resamples - 1))]
    return lo, hi


def summarize(raw: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    out = []
    for row in raw:
        if "error" in row:
            out.append({k: row[k] for k in ("op", "bytes", "requested_bytes", "error")})
            continue
        op, nbytes, samples = row["op"], row["bytes"], row["samples_s"]
        res: dict[str, Any] = {"op": op, "bytes": nbytes, "requested_bytes": row["requested_bytes"], "contenders": {}}
        for name, s in samples.items():
            med = statistics.median(s)
            algbw = nbytes / med / 1e9
            res["contenders"][name] = {
                "time_us": med * 1e6,
                "min_us": min(s) * 1e6,
                "max_us": max(s) * 1e6,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * busbw_factor(op, n),
                "samples_us": [x * 1e6 for x in s],
            }
            if "host_s" in row:
                res["contenders"][name]["host_us"] = row["host_s"][name] * 1e6
        anchor = samples[ANCHOR]
        for name, s in samples.items():
            if name == ANCHOR:
                continue
            res["contenders"][name]["ratio"] = statistics.median(s) / statistics.median(anchor)
            pairs = [a / b for a, b in zip(s, anchor)]
            res["contenders"][name]["pair_ratio"] = statistics.median(pairs)
            res["contenders"][name]["pair_ratio_ci95"] = bootstrap_median_ci(pairs)
        out.append(res)
    return out


def host_summary(results: list[dict[str, Any]]) -> None:
    """``--device cuda``: each contender's host time per op, median over every op and size."""
    per: dict[str, list[float]] = {}
    for res in results:
        for nm, c in res.get("contenders", {}).items():
            if "host_us" in c:
                per.setdefault(nm, []).append(c["host_us"])
    if per:
        print("host µs per op (median over ops and sizes): "
              + ", ".join(f"{nm} {statistics.median(v):.1f}" for nm, v in per.items()))


def print_table(results: list[dict[str, Any]], goal_bytes: tuple[int, ...], goal_ratio: float = 1.05) -> None:
    """A Markdown table: per contender time / algbw / busbw, then each torchcomms contender's
    ratio to c10d (and the median per-iteration ratio)."""
    names: list[str] = []
    for res in results:
        for nm in res.get("contenders", {}):
            if nm not in names:
                names.append(nm)
    names.sort(key=lambda nm: nm == ANCHOR)  # the anchor last
    ours = [nm for nm in names if nm != ANCHOR]
    cols = ["op", "size"]
    for nm in names:
        cols += [f"{nm} µs", "algbw", "busbw"]
    for nm in ours:
        suffix = RATIO_LABELS[nm]
        cols += [f"ratio{suffix}", f"pair{suffix} [95% CI]"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join(["---"] * 2 + ["---:"] * (len(cols) - 2)) + "|")
    for res in results:
        cells = [res["op"], fmt_bytes(res["bytes"])]
        if "error" in res:
            cells.append(f"FAILED: {res['error']}")
            print("| " + " | ".join(cells) + " |")
            continue
        for nm in names:
            c = res["contenders"][nm]
            cells += [f"{c['time_us']:.0f}", f"{c['algbw_GBps']:.3g}", f"{c['busbw_GBps']:.3g}"]
            if "host_us" in c:
                cells[-3] += f" (host {c['host_us']:.1f})"
        for nm in ours:
            c = res["contenders"][nm]
            mark = " ✗" if nm != CONTROL and res["bytes"] in goal_bytes and c["ratio"] > goal_ratio else ""
            lo, hi = c["pair_ratio_ci95"]
            cells += [f"{c['ratio']:.3f}{mark}", f"{c['pair_ratio']:.3f} [{lo:.2f}–{hi:.2f}]"]
        print("| " + " | ".join(cells) + " |")
    print("\ntime: median over iterations of the slowest rank; GB/s = 1e9 B/s; "
          "ratio = torchcomms median / c10d median; pair = median of per-iteration ratios "
          "with its bootstrap 95% CI; "
          f"✗ = above the {goal_ratio:g} goal")


def machine_description() -> dict[str, Any]:
    info: dict[str, Any] = {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                            "torch": torch.__version__}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def mpi_engine() -> Any:
    """benchmarks/comm_bench_mpi.py, the MPI engine's rank side and launcher."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_comm_bench_mpi", Path(__file__).with_name("comm_bench_mpi.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks (default 2; --device cuda: one GPU each, 1 allowed)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu: both contenders on gloo; cuda: both on NCCL, rank r on cuda:r")
    p.add_argument("--host-burst", type=int, default=50, help="--device cuda: calls per host-overhead burst")
    p.add_argument("--engine", default="gloo", choices=("gloo", "mpi"),
                   help="torchcomms' engine: gloo (vs c10d gloo), or mpi (vs bare mpi4py and c10d gloo, "
                        "ranks started by mpiexec)")
    p.add_argument("--mpi-nonblocking-max", type=int, default=None,
                   help="--engine mpi: hint mpi.nonblocking_max_bytes (collectives up to this size as MPI's "
                        "nonblocking calls on the caller's thread; default: the backend's)")
    p.add_argument("--mpi-collectives", choices=("blocking", "nonblocking"), default=None,
                   help="--engine mpi: hint mpi.collectives (every collective one kind; not with "
                        "--mpi-nonblocking-max)")
    p.add_argument("--min-bytes", type=parse_bytes, default=4 << 10, help="smallest size (default 4K)")
    p.add_argument("--max-bytes", type=parse_bytes, default=64 << 20, help="largest size (default 64M)")
    p.add_argument("--step-factor", type=int, default=4, choices=(2, 4), help="size multiplier (default 4)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per contender (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first (default 3)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--tracing", default=None, choices=("on", "off", "both"),
                   help="torchcomms contenders: default tracing (on), TORCHCOMM_TRACING_DISABLE=1 (off), or "
                        "both in the same run (default: on, or off when TORCHCOMM_TRACING_DISABLE=1)")
    p.add_argument("--control", action="store_true",
                   help=f"add an A/A control: c10d on a second gloo group ({CONTROL}), timed like the others; "
                        "its ratio to c10d shows how far apart identical engines measure on this machine")
    p.add_argument("--seed", type=int, default=0, help="seed of the per-iteration contender order")
    p.add_argument("--engines", type=int, default=1,
                   help="engines per contender, used in turn (default 1); identical gloo engines can measure "
                        "tens of percent apart at 16 MiB, so K > 1 keeps one engine's luck out of the ratio")
    p.add_argument("--iface", default="lo", help="network interface for every gloo context (default lo)")
    p.add_argument("--op-timeout", type=float, default=300.0, help="collective timeout in seconds")
    p.add_argument("--deadline", type=float, default=3600.0, help="give up (and kill the ranks) after this many s")
    p.add_argument("--json", default="comm_bench.json", help="where to write the results")
    p.add_argument("--verbose", action="store_true", help="progress lines on stderr")
    p.add_argument("--_rank-result", dest="rank_result", default=None, help=argparse.SUPPRESS)
    return p


def validate(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if not ops or unknown:
        p.error(f"--ops: unknown op(s) {unknown or ops}; choose from {', '.join(OPS)}")
    args.ops = ops
    if args.nproc < (1 if args.device == "cuda" else 2):
        p.error(f"--nproc must be at least {1 if args.device == 'cuda' else 2}, got {args.nproc}")
    if args.min_bytes > args.max_bytes:
        p.error(f"--min-bytes ({args.min_bytes}) is larger than --max-bytes ({args.max_bytes})")
    if args.engines < 1:
        p.error(f"--engines must be >= 1, got {args.engines}")
    if args.iters < 1 or args.warmup < 0:
        p.error(f"--iters must be >= 1 and --warmup >= 0, got {args.iters} and {args.warmup}")
    if args.tracing is None:
        disabled = os.environ.get("TORCHCOMM_TRACING_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")
        args.tracing = "off" if disabled else "on"
    args.sizes = size_sweep(args.min_bytes, args.max_bytes, args.step_factor)
    if args.engine == "mpi" and args.device == "cuda":
        p.error("--engine mpi runs on CPU tensors: drop --device cuda")
    if args.engine == "mpi" and (args.tracing == "both" or args.control or args.engines != 1):
        p.error("--engine mpi runs one torchcomms contender: use --tracing on|off, without --control or --engines")


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    validate(p, args)
    args.argv = argv
    if args.rank_result is not None:
        if args.engine == "mpi":
            mpi_engine().run_rank(args, sys.modules[__name__])
        else:
            run_rank(args)
        return 0
    load_before = os.getloadavg()
    started = datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="comm-bench-") as tmp:
        result_path = Path(tmp) / "rank0.json"
        if args.engine == "mpi":
            mpi_engine().launch(args, result_path, Path(__file__), sys.modules[__name__])
        else:
            launch(args, result_path)
        raw = json.loads(result_path.read_text())
    results = summarize(raw, args.nproc)
    if args.engine == "mpi":
        return report_mpi(args, argv, raw, results, load_before, started)
    # the claims: gloo (CPU) <= 1.05 at 16 and 64 MiB; nccl (CUDA, issue 26) <= 1.02 at >= 1 MiB
    if args.device == "cuda":
        goal_ratio, goal_text = 1.02, "ratio <= 1.02 at >= 1 MiB"
        goal = tuple(sorted({r["bytes"] for r in results if r["bytes"] >= 1 << 20}))
    else:
        goal_ratio, goal_text = 1.05, "ratio <= 1.05 at 16 MiB and 64 MiB"
        goal = (16 << 20, 64 << 20)
    meta = {
        "benchmark": "comm_bench",
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(["python3", "benchmarks/comm_bench.py", *argv]),
        "machine": machine_description(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "nproc": args.nproc,
        "dtype": args.dtype,
        "iters": args.iters,
        "warmup": args.warmup,
        "tracing": args.tracing,
        "control": args.control,
        "engines_per_contender": args.engines,
        "order": f"shuffled per iteration, seed {args.seed}",
        "iface": args.iface,
        "device": args.device,
        "anchor": ANCHOR,
        "note": "time = median over interleaved iterations of the slowest rank; ratio = torchcomms / c10d",
    }
    engine = "nccl (host µs: host time per call, back-to-back)" if args.device == "cuda" else f"gloo on {args.iface}"
    print(f"comm_bench: {args.nproc} ranks, {engine}, {args.dtype}, {args.iters} iters "
          f"(+{args.warmup} warm-up), tracing {args.tracing}, {args.engines} engine(s) per contender; {started:%Y-%m-%d %H:%M} UTC, "
          f"load {load_before[0]:.1f} -> {meta['loadavg_after'][0]:.1f}")
    print_table(results, goal, goal_ratio)
    host_summary(results)
    goal_rows = [(r["op"], nm, c["ratio"]) for r in results if r["bytes"] in goal
                 for nm, c in r.get("contenders", {}).items() if nm not in (ANCHOR, CONTROL)]
    failed = [f"{r['op']} {fmt_bytes(r['bytes'])}" for r in results if "error" in r]
    if failed:
        print(f"FAILED (larger sizes of these ops skipped): {', '.join(failed)}")
    if goal_rows:
        worst = max(goal_rows, key=lambda t: t[2])
        print(f"goal ({goal_text}): worst {worst[0]} {worst[1]} {worst[2]:.3f} -> "
              f"{'met' if worst[2] <= goal_ratio else 'NOT met'}")
    Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"-> {args.json}")
    return 0


def report_mpi(args: argparse.Namespace, argv: list[str], raw: list[dict[str, Any]], results: list[dict[str, Any]],
               load_before: tuple[float, float, float], started: datetime) -> int:
    """The MPI engine's table (ratios to c10d gloo and to bare mpi4py) and its goals."""
    mpi = mpi_engine()
    mpi.add_bare_ratios(results, raw)
    load_after = os.getloadavg()
    print(f"comm_bench --engine mpi: {args.nproc} ranks (mpiexec, shared memory), gloo on {args.iface}, {args.dtype}, "
          f"{args.iters} iters (+{args.warmup} warm-up), tracing {args.tracing}; {started:%Y-%m-%d %H:%M} UTC, "
          f"load {load_before[0]:.1f} -> {load_after[0]:.1f}")
    print_table(results, ())
    print("(the ratio columns are to c10d gloo; samples of torchcomms and mpi4py average several back-to-back ops "
          "at small sizes, see comm_bench_mpi.py)")
    failed = [f"{r['op']} {fmt_bytes(r['bytes'])}" for r in results if "error" in r]
    if failed:
        print(f"FAILED (larger sizes of these ops skipped): {', '.join(failed)}")
    for line in mpi.goals(results, ANCHOR):
        print("goal: " + line)
    meta = {"benchmark": "comm_bench", "engine": "mpi", "date": started.isoformat(timespec="seconds"),
            "command": " ".join(["python3", "benchmarks/comm_bench.py", *argv]), "machine": machine_description(),
            "loadavg_before": load_before, "loadavg_after": load_after, "nproc": args.nproc, "dtype": args.dtype,
            "iters": args.iters, "warmup": args.warmup, "tracing": args.tracing, "anchor": ANCHOR,
            "note": "time = median over interleaved iterations of the slowest rank; ratio = contender / c10d gloo"}
    Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"-> {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
