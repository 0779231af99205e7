"""What a rank pays, after ``import torch``, until its first collective has run: torchcomms'
``new_comm`` + one ``all_reduce`` + ``finalize`` against c10d's ``init_process_group`` + one
``all_reduce`` + ``destroy_process_group`` (the anchor), gloo, one rank, on the CPU.

    python3 benchmarks/first_comm_bench.py                 # 9 rounds
    python3 benchmarks/first_comm_bench.py --rounds 15 --json out.json

Each round runs both in fresh interpreters, alternating the order; ``import torch`` happens before
the clock starts (it is the same for both), everything after it (torchcomms' own imports, the
store, the engine, the first op) is timed inside the process: CPU time (``process_time``) and wall
time. Reports medians and ours / c10d's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.ports import free_port  # noqa: E402 - after the repository is on the path

_OURS = """
import time
import torch
w, c = time.perf_counter(), time.process_time()
import torchcomms
comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="first")
comm.all_reduce(torch.ones(4), torchcomms.ReduceOp.SUM, async_op=False)
comm.finalize()
print(time.perf_counter() - w, time.process_time() - c)
"""

_C10D = """
import time
import torch
w, c = time.perf_counter(), time.process_time()
import torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
print(time.perf_counter() - w, time.process_time() - c)
"""


def _run(script: str) -> tuple[float, float]:
    port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
               TORCHCOMM_RANK="0", TORCHCOMM_SIZE="1")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    if out.returncode != 0:
        raise SystemExit(f"first_comm_bench: a run failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    wall, cpu = out.stdout.split()[-2:]
    return float(wall), float(cpu)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    got: dict[str, list[tuple[float, float]]] = {"torchcomms": [], "c10d": []}
    for i in range(args.rounds):
        order = [("torchcomms", _OURS), ("c10d", _C10D)]
        for name, script in order if i % 2 == 0 else order[::-1]:
            got[name].append(_run(script))
    med = {name: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
           for name, runs in got.items()}
    load = os.getloadavg()[0]
    print(f"first_comm_bench: {args.rounds} rounds, load {load:.1f}; from after `import torch` to a "
          f"finalized communicator with one all_reduce done (gloo, one rank)")
    print(f"{'contender':<12} {'CPU ms':>8} {'wall ms':>8}")
    for name, (wall, cpu) in med.items():
        print(f"{name:<12} {cpu * 1e3:8.1f} {wall * 1e3:8.1f}")
    ratio_cpu = med["torchcomms"][1] / med["c10d"][1]
    ratio_wall = med["torchcomms"][0] / med["c10d"][0]
    print(f"torchcomms / c10d: CPU {ratio_cpu:.2f}, wall {ratio_wall:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"rounds": args.rounds, "load": load, "median_s": med,
                                         "ratio_cpu": ratio_cpu, "ratio_wall": ratio_wall}, indent=2))


if __name__ == "__main__":
    main()
