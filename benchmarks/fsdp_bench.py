"""Whole FSDP training steps: fsdp2 (torchcomms communicators) vs stock ``fully_shard`` on c10d,
same engine (gloo on CPU), same model (kernels.model Llama), same data, same initial weights.

Contenders, timed round-robin inside the same rank processes (so load on a shared machine hits
all of them alike):

  fsdp2              fsdp2.fully_shard, all-gather / reduce-scatter on their own communicators,
                     1 reduce-scatter in flight (--max-in-flight), forward prefetch 1
  fsdp2-no-prefetch  the same with prefetch=0 (FSDP's own backward prefetch only)
  fsdp2-no-overlap   fsdp2.fully_shard(overlap=False): one communicator, every op waited
  stock              torch.distributed.fsdp.fully_shard on the c10d gloo group
  stock-separate-rs  the same with torch's set_separate_reduce_scatter_group (torch >= 2.13)
  compute            the unsharded model on the rank's batch, no communication (the anchor for
                     exposed communication)

Reported per contender: median step time (ms; the slowest rank's median), throughput relative
to stock, exposed communication share = (step − compute step) / step (communication the step
waited for, plus FSDP's copies), and the loss curves side by side. Memory, each contender alone
in fresh processes (3 steps, then one more under torch.profiler; max over ranks):

  alloc MiB   the peak of torch-allocated CPU bytes during a steady-state step, above what was
              allocated once the model was built (benchmarks/alloc_peak.py: c10's allocator
              counts every allocation and free, on every thread; the CPU analogue of
              torch.cuda.max_memory_allocated). Deterministic. The memory goal is judged on it.
  VmHWM MiB   the rise of the process' resident high-water mark over the 3 steps above its
              resident size after the model was built: adds malloc's caching and per-thread
              arenas, and moves by +-10 % between runs of the same code.

With the allocation trace the bytes alive at the peak are listed by allocation site (the FSDP
range or autograd function and the op that allocated them).

  python3 benchmarks/fsdp_bench.py --ranks 4               # the BENCHMARKS.md row
  python3 benchmarks/fsdp_bench.py --ranks 2 --smoke       # seconds, for CI
  python3 benchmarks/fsdp_bench.py --ranks 4 --memory-only --contenders fsdp2 stock   # memory alone
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.ports import free_port  # noqa: E402 - after the repository is on the path

CONTENDERS = ("fsdp2", "fsdp2-no-prefetch", "fsdp2-no-overlap", "stock", "stock-separate-rs", "compute")


# --- one rank ------------------------------------------------------------------------------

def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def build(name: str, args: argparse.Namespace, comm: Any) -> tuple[Any, Any]:
    import torch
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    import fsdp2
    from kernels.model import Llama, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig.tiny(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                           n_kv_heads=args.heads // 2, ffn_dim=4 * args.dim, loss_impl=args.loss)
    model = Llama(cfg)
    if name.startswith("fsdp2"):
        kw = dict(overlap=name != "fsdp2-no-overlap", prefetch=0 if name == "fsdp2-no-prefetch" else args.prefetch)
        for blk in model.blocks:
            fsdp2.fully_shard(blk, comm, **kw)
        fsdp2.fully_shard(model, comm, **kw)
    elif name.startswith("stock"):
        mesh = fsdp2.fsdp_comms(comm).mesh
        for blk in model.blocks:
            torch_fully_shard(blk, mesh=mesh)
        torch_fully_shard(model, mesh=mesh)
        if name == "stock-separate-rs":
            model.set_separate_reduce_scatter_group(True)
    return model, torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=True)


def step_fn(model: Any, opt: Any, batch: Any) -> Callable[[], float]:
    def step() -> float:
        loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return step


def traced_step(built: tuple[Any, Any], batch: Any, comm: Any, baseline: int) -> dict[str, Any]:
    """One more step under the allocation trace (after VmHWM was read: the profiler's own
    buffers are not the contender's). ``baseline``: the allocator's count after the model was
    built. Returns the peak of torch-allocated bytes over it, what the step started with, what
    it left allocated once the engines' threads let go of its ops (``allocated_after``), and the
    step's own blocks alive at the peak by allocation site."""
    import gc

    from benchmarks.alloc_peak import AllocationTrace, Peak, allocated_after

    gc.collect()
    comm.barrier(async_op=False)
    with AllocationTrace() as trace:
        step_fn(*built, batch)()
    peak = trace.peak()
    return {"alloc_peak_bytes": peak.peak - baseline, "alloc_start_bytes": peak.start - baseline,
            "alloc_end_bytes": allocated_after(peak) - baseline, "alloc_sites": Peak.by_site(peak.live),
            "alloc_at": list(peak.at)}


def worker(args: argparse.Namespace) -> None:
    import torch

    import torchcomms

    torch.set_num_threads(args.threads)
    traced = bool(args.only and args.alloc_trace)
    if traced:
        from benchmarks.alloc_peak import allocated_now, count_allocations

        count_allocations()  # before anything of the run is allocated
    rank = int(os.environ["RANK"])
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="bench",
                               abort_process_on_timeout_or_error=False)
    import fsdp2

    comms = fsdp2.fsdp_comms(comm)  # splits and the metadata group, before anything is timed
    if args.max_in_flight > 0:
        comms.reductions.max_in_flight = args.max_in_flight
    names = [args.only] if args.only else [n for n in CONTENDERS if n in args.contenders]
    if "stock-separate-rs" in names and not hasattr(torch.distributed.fsdp.FSDPModule,
                                                    "set_separate_reduce_scatter_group"):
        names.remove("stock-separate-rs")  # torch < 2.13
    g = torch.Generator().manual_seed(1000 + rank)
    data = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
            for _ in range(args.warmup + args.steps)]
    rss0 = _rss_kib("VmRSS")
    built = {n: build(n, args, comm) for n in names}
    rss_built = _rss_kib("VmRSS")
    alloc_built = allocated_now() if traced else 0
    times: dict[str, list[float]] = {n: [] for n in names}
    losses: dict[str, list[float]] = {n: [] for n in names}
    for i, batch in enumerate(data):
        order = names[i % len(names):] + names[:i % len(names)]  # rotate who goes first
        for n in order:
            comm.barrier(async_op=False)
            t0 = time.perf_counter()
            loss = step_fn(*built[n], batch)()
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                times[n].append(dt)
            losses[n].append(loss)
    out = {"rank": rank, "times": times, "losses": losses, "rss_before_kib": rss_built,
           "rss_model_kib": rss_built - rss0, "hwm_kib": _rss_kib("VmHWM"), "torch": torch.__version__,
           "contenders": names}
    if traced and args.only in built:
        out.update(traced_step(built[args.only], data[-1], comm, alloc_built))
    Path(args.out).write_text(json.dumps(out))
    comm.barrier(async_op=False)
    os._exit(0)  # engines of split communicators need no orderly teardown for a benchmark


# --- the launcher --------------------------------------------------------------------------

def launch(args: argparse.Namespace, only: str | None = None) -> list[dict[str, Any]]:
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="fsdp-bench-"))
    procs = []
    for r in range(args.ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.ranks), TORCHCOMM_RANK=str(r),
                   TORCHCOMM_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   LOCAL_RANK=str(r), OMP_NUM_THREADS=str(args.threads),
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        env.pop("TORCHCOMM_CONTROL_ADDR", None)
        cmd = [sys.executable, __file__, "--worker", "--out", str(tmp / f"rank{r}.json")] + args.passthrough
        if only:
            cmd += ["--only", only]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = [p.communicate(timeout=args.timeout)[0].decode(errors="replace") for p in procs]
    bad = [r for r, p in enumerate(procs) if p.returncode != 0]
    if bad:
        raise SystemExit(f"rank {bad[0]} failed:\n{logs[bad[0]][-4000:]}")
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(args.ranks)]


def memory_of(res: list[dict[str, Any]]) -> dict[str, Any]:
    """One contender's memory run, over its ranks: the VmHWM rise (max over ranks) and, with
    the allocation trace, the peak of allocated bytes (max over ranks; its sites from that rank)."""
    out: dict[str, Any] = {"hwm_rise_kib": max(r["hwm_kib"] - r["rss_before_kib"] for r in res),
                           "torch": res[0]["torch"]}
    traced = [r for r in res if "alloc_peak_bytes" in r]
    if traced:
        top = max(traced, key=lambda r: r["alloc_peak_bytes"])
        out.update(alloc_peak_bytes=top["alloc_peak_bytes"], alloc_peak_rank=top["rank"],
                   alloc_peak_by_rank=[r["alloc_peak_bytes"] for r in traced],
                   **{k: top[k] for k in ("alloc_start_bytes", "alloc_end_bytes", "alloc_sites", "alloc_at")})
    return out


def summarize(timed: list[dict[str, Any]] | None, memory: dict[str, dict[str, Any]],
              names: list[str]) -> list[dict[str, Any]]:
    med = {n: max(statistics.median(r["times"][n]) for r in timed) for n in names} if timed else {}
    compute = med.get("compute")
    rows = []
    for n in names:
        mem = memory.get(n, {})
        row = {"contender": n, "step_ms": 1e3 * med[n] if n in med else None,
               "throughput_vs_stock": med["stock"] / med[n] if "stock" in med and n in med else None,
               "exposed_comm_share": (med[n] - compute) / med[n] if compute and n in med and n != "compute" else None,
               "peak_step_mem_mib": mem["hwm_rise_kib"] / 1024 if mem else None,
               "peak_alloc_mib": mem["alloc_peak_bytes"] / 2**20 if "alloc_peak_bytes" in mem else None,
               "memory": mem,
               "losses": timed[0]["losses"][n] if timed else None}
        rows.append(row)
    return rows


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: list[dict[str, Any]], sites: int = 6) -> None:
    stock = next((r for r in rows if r["contender"] == "stock"), None)
    print(f"{'contender':<18} {'step ms':>9} {'thru/stock':>10} {'exposed':>8} {'VmHWM MiB':>10} "
          f"{'alloc MiB':>10} {'alloc/stock':>11}")
    for r in rows:
        exp = None if r["exposed_comm_share"] is None else 100 * r["exposed_comm_share"]
        rel = (r["peak_alloc_mib"] / stock["peak_alloc_mib"]
               if stock and r["peak_alloc_mib"] and stock["peak_alloc_mib"] else None)
        print(f"{r['contender']:<18} {_fmt(r['step_ms'], '9.1f')} {_fmt(r['throughput_vs_stock'], '10.3f')} "
              f"{_fmt(exp, '7.1f') + ('%' if exp is not None else ''):>8} {_fmt(r['peak_step_mem_mib'], '10.1f')} "
              f"{_fmt(r['peak_alloc_mib'], '10.2f')} {_fmt(rel, '11.3f')}")
    if sites and any(r["memory"].get("alloc_sites") for r in rows):
        print(f"\nallocated at the peak, by site (MiB; the rank with the highest peak; top {sites}):")
        for r in rows:
            m = r["memory"]
            if not m.get("alloc_sites"):
                continue
            print(f"  {r['contender']} (rank {m['alloc_peak_rank']}; peak reached in "
                  f"{' > '.join(m['alloc_at'][-3:]) or '-'}):")
            print(f"    {m['alloc_start_bytes'] / 2**20:8.2f}  allocated when the step started")
            listed = list(m["alloc_sites"].items())
            for site, nbytes in listed[:sites]:
                print(f"    {nbytes / 2**20:8.2f}  {site}")
            rest = sum(b for _, b in listed[sites:])
            other = m["alloc_peak_bytes"] - m["alloc_start_bytes"] - sum(b for _, b in listed)
            print(f"    {rest / 2**20:8.2f}  the step's other sites")
            print(f"    {other / 2**20:8.2f}  allocated on other threads (negative: listed blocks freed there)")
            print(f"    {m['alloc_end_bytes'] / 2**20:8.2f}  allocated when the step ended")
    if rows[0]["losses"] is not None:
        print("\nloss curves (rank 0), side by side:")
        print("step " + " ".join(f"{r['contender']:>18}" for r in rows))
        for i in range(len(rows[0]["losses"])):
            print(f"{i:>4} " + " ".join(f"{r['losses'][i]:>18.6f}" for r in rows))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--loss", choices=("auto", "torch", "fused"), default="auto")
    p.add_argument("--prefetch", type=int, default=1, help="fsdp2's forward prefetch depth (modules all-gathered ahead)")
    p.add_argument("--max-in-flight", type=int, default=0,
                   help="fsdp2's reduce-scatters left in flight at most (0: the library's default)")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads per rank (a many-core host: cores / ranks leaves compute to overlap with)")
    p.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    p.add_argument("--no-memory", action="store_true", help="skip the per-contender memory runs")
    p.add_argument("--alloc-trace", type=int, default=1,
                   help="memory runs: one more step under torch.profiler's memory events (peak allocated bytes)")
    p.add_argument("--memory-only", action="store_true", help="only the per-contender memory runs (no timed run)")
    p.add_argument("--sites", type=int, default=6, help="allocation sites printed per contender (0: none)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 3 steps")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--json", type=str, default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--only", type=str, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", type=str, default=None, help=argparse.SUPPRESS)
    return p


def passthrough(args: argparse.Namespace) -> list[str]:
    """The options every rank process gets (the worker rebuilds ``args`` from them)."""
    keep = ("steps", "warmup", "dim", "layers", "heads", "vocab", "seq", "batch", "lr", "loss", "prefetch", "threads",
            "max_in_flight", "alloc_trace")
    return [x for k in keep for x in ("--" + k.replace("_", "-"), str(getattr(args, k)))] + ["--contenders", *args.contenders]


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.smoke:
        args.dim, args.layers, args.vocab, args.seq, args.steps, args.warmup = 64, 2, 512, 32, 3, 1
    if args.worker:
        worker(args)
        return 0
    args.passthrough = passthrough(args)
    started = datetime.now(timezone.utc)
    load0 = os.getloadavg()
    timed = None if args.memory_only else launch(args)
    names = timed[0]["contenders"] if timed else [n for n in CONTENDERS if n in args.contenders]
    memory: dict[str, dict[str, Any]] = {}
    if not args.no_memory:
        one = argparse.Namespace(**{**vars(args), "steps": 3, "warmup": 0})
        one.passthrough = passthrough(one)
        for n in names:
            res = launch(one, only=n)
            if n in res[0]["contenders"]:  # not run: stock-separate-rs on torch < 2.13
                memory[n] = memory_of(res)
    rows = summarize(timed, memory, [n for n in names if n in memory or timed])
    torch_version = timed[0]["torch"] if timed else next(iter(memory.values()), {}).get("torch", "?")
    print(f"fsdp_bench: {args.ranks} ranks, dim {args.dim}, {args.layers} layers, vocab {args.vocab}, "
          f"batch {args.batch}x{args.seq}, {args.steps} timed steps, prefetch {args.prefetch}, "
          f"reduce-scatters in flight {args.max_in_flight or 'default'}, "
          f"{args.threads} thread(s)/rank; torch {torch_version}; "
          f"{os.cpu_count()} CPUs; load {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}; {started:%Y-%m-%d %H:%M} UTC")
    print_table(rows, args.sites)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "passthrough"},
                                               "machine": platform.platform(), "started": started.isoformat(),
                                               "load": [load0, os.getloadavg()], "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
