"""Where the test suite's CPU goes: a pytest plugin and its report.

Each test's CPU is the change, from its set-up to its teardown, of the summed CPU time
(``utime + stime + cutime + cstime`` in ``/proc/<pid>/stat``) of the pytest process's whole tree
of processes: a rank, a launcher's worker or a zygote's child that ended and was reaped inside
the tree is still counted, through its reaper's ``cutime``. Not counted: processes that left the
tree (daemonised, or reparented to init), such as the ranks ``mpiexec``'s daemon starts.

    PYTHONPATH=.:benchmarks/diagnostics python3 -m pytest -n 3 -p suite_cpu tests   # writes suite_cpu.*.jsonl
    python3 benchmarks/diagnostics/suite_cpu.py [--top 40]                           # the report

``SUITE_CPU_OUT`` (default ``suite_cpu``) is the records' path prefix, one file per pytest process.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import time
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")
_OUT = os.environ.get("SUITE_CPU_OUT", "suite_cpu")
_started: dict[str, tuple[float, float]] = {}


def tree_cpu(root: int) -> float:
    """Seconds of CPU of ``root`` and every process below it, with their reaped children's."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        children[int(fields[1])].append(pid)
        cpu[pid] = sum(int(x) for x in fields[11:15]) / _TICK
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += cpu.get(pid, 0.0)
        stack.extend(children.get(pid, ()))
    return total


def pytest_runtest_setup(item: Any) -> None:
    _started[item.nodeid] = (tree_cpu(os.getpid()), time.monotonic())


def pytest_runtest_logreport(report: Any) -> None:
    if report.when != "teardown" or report.nodeid not in _started:
        return
    cpu0, t0 = _started.pop(report.nodeid)
    record = {"id": report.nodeid, "cpu": tree_cpu(os.getpid()) - cpu0, "wall": time.monotonic() - t0}
    with open(f"{_OUT}.{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def report(prefix: str, top: int) -> None:
    records = [json.loads(line) for path in glob.glob(f"{prefix}.*.jsonl") for line in open(path)]
    if not records:
        raise SystemExit(f"no records under {prefix}.*.jsonl")
    print(f"{len(records)} tests, {sum(r['cpu'] for r in records):.0f} s of CPU, "
          f"{sum(r['wall'] for r in records):.0f} s of test time")
    by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in records:
        row = by_file[r["id"].split("::")[0]]
        row[0] += r["cpu"]
        row[1] += r["wall"]
        row[2] += 1
    print(f"\n{'CPU s':>8} {'wall s':>8} {'tests':>5}  file")
    for name, (cpu, wall, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{cpu:8.1f} {wall:8.1f} {n:5d}  {name}")
    print(f"\n{'CPU s':>8} {'wall s':>8}  test")
    for r in sorted(records, key=lambda r: -r["cpu"])[:top]:
        print(f"{r['cpu']:8.1f} {r['wall']:8.1f}  {r['id']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", default=_OUT, help="the records' path prefix (SUITE_CPU_OUT)")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    report(args.prefix, args.top)


if __name__ == "__main__":
    main()
