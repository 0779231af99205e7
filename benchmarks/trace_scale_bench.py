"""``torchcomms-trace`` at cluster size: analyze (and view) 1,024 ranks' flight-recorder dumps.

    python3 benchmarks/trace_scale_bench.py                       # 1,024 ranks x 2,048 entries
    python3 benchmarks/trace_scale_bench.py --ranks 128 --entries 512 --dumps /tmp/fr128

Writes the synthetic dumps first (``benchmarks/trace_dumps_gen.py``, the recorder's own writer)
unless ``--dumps`` already holds them, then runs, each in a fresh process, timed, with its peak
resident memory (``wait4``'s ``ru_maxrss``: the largest process of the command's tree) and the
peak of its process tree's summed RSS (the parse runs in worker processes), and the load average
before and after each:

- ``torchcomms-trace analyze`` (the claim: <= 10 s and <= 2 GiB at 1,024 x 2,048);
- ``torchcomms-trace view`` (the HTML page with aggregated lanes; its size is printed);
- the anchor: PyTorch's own analyzer (``python -m torch.distributed.flight_recorder.fr_trace``)
  on the same dumps, stopped at ``--anchor-limit`` seconds.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tree_rss_mib(root: int) -> float:
    """Resident MiB of ``root`` and every process under it, summed (pages a fork shares count
    once per process, so this is an upper bound of the memory the tree holds)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parent[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(c for c, p in parent.items() if p == pid and c not in tree)
    pages = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                pages += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(cmd: list[str], limit: float) -> tuple[float, float, float, float, int, str]:
    """(wall seconds, CPU seconds of the command and its worker processes, peak RSS MiB of its
    largest process (``os.wait4``), peak RSS MiB of its process tree summed (sampled every
    50 ms), exit code, first output line) of ``cmd``, killed at ``limit`` seconds."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"trace_scale_bench.{os.getpid()}.out"
    with open(log, "wb") as out:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = start + limit
        tree_peak, next_sample = 0.0, start
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            if time.monotonic() >= next_sample:
                tree_peak, next_sample = max(tree_peak, tree_rss_mib(proc.pid)), time.monotonic() + 0.05
            time.sleep(0.01)
        wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = log.read_text(errors="replace").strip().splitlines()
    log.unlink()
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024, tree_peak, proc.returncode, (text[0] if text else "")[:160]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--entries", type=int, default=2048)
    parser.add_argument("--dumps", default=None, help="folder of dumps (written if empty/absent)")
    parser.add_argument("--anchor-limit", type=float, default=120.0)
    parser.add_argument("--limit", type=float, default=600.0, help="wall limit of our commands")
    parser.add_argument("--no-view", action="store_true")
    args = parser.parse_args()
    dumps = Path(args.dumps or f"/tmp/torchcomms_fr_{args.ranks}x{args.entries}")
    if not dumps.is_dir() or len(list(dumps.glob("fr_rank_*"))) != args.ranks:
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trace_dumps_gen.py"), str(dumps),
                        "--ranks", str(args.ranks), "--entries", str(args.entries)], check=True)
    size = sum(p.stat().st_size for p in dumps.glob("fr_rank_*")) / 2**20
    load0 = os.getloadavg()[0]
    cli = [sys.executable, "-m", "torchcomms.tracing.viewer"]
    loads: list[str] = []

    def timed(cmd: list[str], limit: float) -> tuple[float, float, float, float, int, str]:
        before = os.getloadavg()[0]
        result = measure(cmd, limit)
        loads.append(f"{before:.1f} -> {os.getloadavg()[0]:.1f}")
        return result

    rows = [("torchcomms-trace analyze", timed(cli + ["analyze", str(dumps)], args.limit))]
    if not args.no_view:
        page = dumps.parent / f"{dumps.name}.html"
        rows.append(("torchcomms-trace view", timed(cli + ["view", str(dumps), "-o", str(page)], args.limit)))
    anchor = timed([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dumps),
                    "-p", "fr_rank_"], args.anchor_limit)
    rows.append(("PyTorch fr_trace (anchor)", anchor))
    load1 = os.getloadavg()[0]
    print(f"{args.ranks} ranks x {args.entries} entries ({size:.0f} MiB of pickled dumps) in {dumps}; "
          f"{os.cpu_count()} cores shared with other users, load average {load0:.1f} -> {load1:.1f}")
    print("| tool | wall s | CPU s | peak RSS MiB (largest process) | peak RSS MiB (process tree, sampled) | exit | vs anchor (wall) | load average (1 min) | first output line |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for (name, (wall, cpu, rss, tree, code, line)), load in zip(rows, loads):
        limit = args.anchor_limit if "anchor" in name else args.limit
        stopped = code not in (0, 1) and wall >= limit
        ratio = "-" if "anchor" in name else (f"{wall / anchor[0]:.3f}" + (" (anchor stopped)" if anchor[0] >= args.anchor_limit else ""))
        print(f"| {name} | {wall:.2f}{'+ (stopped)' if stopped else ''} | {cpu:.1f} | {rss:.0f} | {tree:.0f} | {code} | {ratio} | {load} | {line} |")
    if not args.no_view and page.exists():
        print(f"HTML page: {page.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
