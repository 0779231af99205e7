"""torch.distributed on our communicators (TORCH_DISTRIBUTED_USE_TORCHCOMMS=1) vs c10d's gloo.

    python3 benchmarks/dist_bench.py                    # 2 ranks, 16 MiB all_reduce, FSDP2 step, host cost
    python3 benchmarks/dist_bench.py --iters 40 --steps 20 --json out.json

Each rank process starts with TORCH_DISTRIBUTED_USE_TORCHCOMMS=1, so ``init_process_group("gloo")``
makes the default group on a torchcomms communicator (the route); with
``torch.distributed.config.use_torchcomms`` then switched off, ``new_group`` makes a second group
on c10d's own ProcessGroupGloo (the anchor) over the same ranks, and a third for barriers. The
same program runs on each, interleaved in alternating order every iteration:

- ``all_reduce``: ``dist.all_reduce`` of 16 MiB float32;
- ``fsdp2 step``: forward + backward + SGD step of a 4-layer MLP (1024 wide) under torch's
  ``fully_shard`` on a DeviceMesh over the group;
- ``host cost``: ``dist.all_reduce`` of one float through the route vs ``comm.all_reduce`` on the
  route's bare communicator: the difference is what the c10d layer (the C++ wrapper, the
  forwarder, c10d's Python) adds per op.

Times are rank 0's medians (every op starts after a barrier); ratio = route / anchor.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _timed(fn: Any, barrier: Any) -> float:
    barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def rank_main(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.distributed.config as dist_config
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    import torchcomms

    dist.init_process_group("gloo")
    route = dist.group.WORLD
    comm = route._get_backend(torch.device("cpu")).get_comm()
    dist_config.use_torchcomms = False
    anchor = dist.new_group(backend="gloo")
    sync = dist.new_group(backend="gloo")
    assert not hasattr(anchor._get_backend(torch.device("cpu")), "get_comm")

    def barrier() -> None:
        dist.barrier(group=sync)

    groups = {"route": route, "c10d": anchor}
    big = {k: torch.ones(args.mib * 2**18) for k in groups}
    one = {k: torch.ones(1) for k in groups}

    def models() -> dict[str, Any]:
        out = {}
        for k, g in groups.items():
            torch.manual_seed(0)
            m = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(4)])
            mesh = DeviceMesh.from_group(g, "cpu")
            for layer in m:
                fully_shard(layer, mesh=mesh)
            fully_shard(m, mesh=mesh)
            out[k] = (m, torch.optim.SGD(m.parameters(), lr=1e-3))
        return out

    ms = models()
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(dist.get_rank()))

    def step(k: str) -> None:
        m, opt = ms[k]
        loss = m(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    times: dict[str, dict[str, list[float]]] = {"all_reduce": {}, "fsdp2_step": {}, "host_cost": {}}
    for k in groups:  # warm-up
        dist.all_reduce(big[k], group=groups[k])
        step(k)
    for it in range(args.iters):
        order = list(groups) if it % 2 == 0 else list(reversed(groups))
        for k in order:
            times["all_reduce"].setdefault(k, []).append(
                _timed(lambda k=k: dist.all_reduce(big[k], group=groups[k]), barrier))
    for it in range(args.steps):
        order = list(groups) if it % 2 == 0 else list(reversed(groups))
        for k in order:
            times["fsdp2_step"].setdefault(k, []).append(_timed(lambda k=k: step(k), barrier))
    small = torch.ones(1)
    contenders = {"route": lambda: dist.all_reduce(one["route"], group=route),
                  "bare comm": lambda: comm.all_reduce(small, torchcomms.ReduceOp.SUM, False)}
    for it in range(args.small_iters):
        order = list(contenders) if it % 2 == 0 else list(reversed(contenders))
        for k in order:
            times["host_cost"].setdefault(k, []).append(_timed(contenders[k], barrier))
    dist.destroy_process_group()
    return {name: {k: statistics.median(v) for k, v in d.items()} for name, d in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--mib", type=int, default=16)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--small-iters", type=int, default=300)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--json", type=str, default=None)
    p.add_argument("--rank-out", type=str, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_out:
        result = rank_main(args)
        Path(args.rank_out).write_text(json.dumps(result))
        return
    import socket
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="dist-bench-"))
    procs = []
    for r in range(args.nproc):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_DISTRIBUTED_USE_TORCHCOMMS="1",
                   PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("TORCHCOMM_CONTROL_ADDR", None)
        procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--rank-out", str(tmp / f"r{r}.json")],
                                      env=env))
    codes = [pr.wait() for pr in procs]
    if any(codes):
        sys.exit(f"a rank failed: exit codes {codes}")
    res = json.loads((tmp / "r0.json").read_text())
    load = os.getloadavg()
    print(f"{args.nproc} ranks, torch.distributed, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    rows = [("all_reduce %d MiB" % args.mib, "all_reduce", "route", "c10d"),
            ("FSDP2 step (4x%d MLP)" % args.width, "fsdp2_step", "route", "c10d")]
    print(f"{'':28s} {'route (ms)':>12s} {'c10d gloo (ms)':>15s} {'ratio':>7s}")
    for label, key, a, b in rows:
        ta, tb = res[key][a] * 1e3, res[key][b] * 1e3
        print(f"{label:28s} {ta:12.3f} {tb:15.3f} {ta / tb:7.3f}")
    hc = res["host_cost"]
    print(f"{'1-float all_reduce':28s} {hc['route'] * 1e6:10.1f}us {hc['bare comm'] * 1e6:13.1f}us (bare comm)"
          f"  route adds {(hc['route'] - hc['bare comm']) * 1e6:.1f} us/op")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": res, "load": load, "args": vars(args)}, indent=1))


if __name__ == "__main__":
    main()
