"""How much Python one synchronous all_reduce runs through the dispatch path: bytecodes executed
and calls made per op, per function. Unlike a timing these counts do not move with the host's
load, so two versions of the path compare exactly (the timings of a shared VM vary by a third
from run to run).

    python3 benchmarks/diagnostics/dispatch_bytecodes.py                      # fake backend
    mpiexec -n 1 python3 benchmarks/diagnostics/dispatch_bytecodes.py --backend mpi
    python3 benchmarks/diagnostics/dispatch_bytecodes.py --tracing off --top 30
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import torchcomms  # noqa: E402
from torchcomms import ReduceOp  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="fake", help="fake (no engine), or mpi under mpiexec -n 1")
    p.add_argument("--tracing", choices=("on", "off"), default="on")
    p.add_argument("--ops", type=int, default=200)
    p.add_argument("--top", type=int, default=0, help="also list the functions running the most bytecodes")
    args = p.parse_args()
    os.environ["TORCHCOMM_TRACING_DISABLE"] = "0" if args.tracing == "on" else "1"
    comm = torchcomms.new_comm(args.backend, torch.device("cpu"), "bytecodes", timeout=timedelta(seconds=60))
    t = torch.ones(256)
    for _ in range(100):  # warm: lazily made state is not part of an op
        comm.all_reduce(t, ReduceOp.SUM, False)
    per_function: Counter[str] = Counter()
    calls = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:  # noqa: ARG001
        nonlocal calls
        frame.f_trace_opcodes = True
        if event == "call":
            calls += 1
        elif event == "opcode":
            code = frame.f_code
            per_function[f"{Path(code.co_filename).name}:{code.co_qualname}"] += 1
        return tracer

    sys.settrace(tracer)
    for _ in range(args.ops):
        comm.all_reduce(t, ReduceOp.SUM, False)
    sys.settrace(None)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.ops):
        comm.all_reduce(t, ReduceOp.SUM, False)
    profile.disable()
    all_calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    n = args.ops
    print(f"{args.backend}, tracing {args.tracing}: {sum(per_function.values()) / n:.0f} bytecodes, "
          f"{calls / n:.1f} Python calls, {all_calls / n:.1f} calls with C functions per op")
    for name, count in per_function.most_common(args.top):
        print(f"{count / n:8.1f}  {name}")
    comm.finalize()


if __name__ == "__main__":
    main()
