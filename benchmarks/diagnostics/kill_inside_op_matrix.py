"""Which survivors see a peer's death at once, op by op, without the launcher and the store watch.

For each op, world size and victim: ranks loop on the op (about 16 MiB), the victim SIGKILLs
itself while one is in flight, and every survivor stays alive until every other survivor's op
ended (``tests/recovery/nolaunch_workers.py:kill_inside_op``). A row lists the survivors that
did not end with ``PeerFailureError`` (they waited out the op timeout instead):

    python3 benchmarks/diagnostics/kill_inside_op_matrix.py --op-timeout 15
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.helpers.ranks import RankGroup  # noqa: E402
from tests.helpers.store_host import watched_tcp_store  # noqa: E402

OPS = ("all_reduce", "broadcast", "all_gather_single", "reduce_scatter_single", "all_to_all_single", "ring_p2p")


def run_one(world: int, victim: int, op: str, op_timeout_s: float) -> tuple[list[str], float]:
    """The survivors that did not raise ``PeerFailureError`` (with what they got), and the wall time."""
    start = time.monotonic()
    with watched_tcp_store("tc-killop-") as env:  # the watch turned off below
        with RankGroup(world, "tests.recovery.nolaunch_workers:kill_inside_op",
                       {"victim": victim, "op": op, "op_timeout_s": op_timeout_s},
                       env={**env, "TORCHCOMM_STORE_WATCH": "0"}) as g:
            results = g.wait(timeout=op_timeout_s * 4 + 60, failed_grace=op_timeout_s * 3 + 30)
    late = []
    for r in results:
        if r.rank == victim:
            continue
        if r.returncode != 0:
            late.append(f"rank {r.rank}: exit {r.returncode}")
        elif r.value.get("raised") != "PeerFailureError":
            late.append(f"rank {r.rank}: {r.value.get('raised')}")
    return late, time.monotonic() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--worlds", default="3,4")
    p.add_argument("--op-timeout", type=float, default=15.0)
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    ok = total = 0
    print("| op | world | victim | survivors without PeerFailureError | s |\n|---|---:|---:|---|---:|")
    for _ in range(args.repeat):
        for world in map(int, args.worlds.split(",")):
            for victim in sorted({0, 1, world - 1}):
                for op in args.ops.split(","):
                    late, secs = run_one(world, victim, op, args.op_timeout)
                    total += 1
                    ok += not late
                    print(f"| {op} | {world} | {victim} | {'; '.join(late) or '-'} | {secs:.1f} |", flush=True)
    print(f"\n{ok} of {total} runs: every survivor raised PeerFailureError")


if __name__ == "__main__":
    main()
