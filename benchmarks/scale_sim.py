"""The control plane at 100k ranks: a cost model of the flat design (every rank talks to one
server) and of the hierarchical one of docs/SCALE.md (node agents, group aggregators, a sharded
root store), built on per-message costs measured by ``benchmarks/scale_bench.py``.

    python3 benchmarks/scale_sim.py                          # the per-message costs below
    python3 benchmarks/scale_sim.py --from-json /tmp/scale.json --ranks 4096,16384,102400

``--from-json`` takes the costs from a scale_bench run (its largest N of our server): server CPU
per heartbeat, per small request (barrier and agreement phases), per event delivered (fan-out
phase) and per key read (rendezvous phase). The model is arithmetic, not a measurement: each
tier serves its children one message at a time (a serving thread each), tiers work in
parallel, and a hop between machines adds ``--hop-ms``.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Costs:
    """Server CPU seconds per message, measured."""

    beat: float = 72e-6      # one heartbeat (scale_bench, 1,024 ranks)
    request: float = 30e-6   # one small store request (barrier/agreement phases)
    event: float = 20e-6     # one event delivered to one subscriber (fan-out phase)
    key: float = 1.3e-6      # one key of a multi_get (rendezvous phase)
    source: str = "defaults: scale_bench at 1,024 ranks, load 28-36 on 2 shared cores"


def costs_from(path: Path) -> Costs:
    data = json.loads(path.read_text())
    ours = max((r for r in data["results"] if r["kind"] == "ours"), key=lambda r: r["ranks"])
    n = ours["ranks"]
    c = Costs(source=f"{path} (ours at {n} ranks, load {data['load'][0][0]:.0f}-{data['load'][1][0]:.0f})")
    if ours.get("hb_beats"):
        c.beat = ours["heartbeat_cpu_s"] / ours["hb_beats"]
    if ours.get("barrier_cpu_s"):
        c.request = max(ours["barrier_cpu_s"] / (2 * n), 1e-6)
    if ours.get("fanout_cpu_s"):
        c.event = max(ours["fanout_cpu_s"] / n, 1e-6)
    if ours.get("rendezvous_cpu_s"):
        c.key = max(ours["rendezvous_cpu_s"] / (n * n), 1e-8)
    return c


ADDRESS_BYTES = 24  # one rank's address in the table


def flat(n: int, c: Costs, beat_s: float, hop: float, bw: float) -> dict[str, float]:
    return {
        "heartbeat core share": n / beat_s * c.beat,
        "event fan-out s": n * c.event + hop,
        # check-in (set + add), then every survivor blocks on the decision and is woken
        "shrink agreement s": (n - 1) * 2 * c.request + (n - 1) * c.event + 2 * hop,
        # every rank reads every address
        "rendezvous s": n * n * c.key + n * 2 * c.request + n * n * ADDRESS_BYTES / bw + hop,
    }


def hierarchical(n: int, c: Costs, beat_s: float, hop: float, bw: float, node: int, group: int,
                 shards: int) -> dict[str, float]:
    nodes = math.ceil(n / node)
    groups = math.ceil(nodes / group)
    # each tier serves its children; the root serves the group aggregators
    tier = [node, group, groups]  # children per server at agent, aggregator, root
    fan = sum(k * c.event for k in tier) + 3 * hop
    # check-ins go up (each tier counts its children's), the decision comes down
    agree = sum(k * 2 * c.request for k in tier) + fan + 3 * hop
    # addresses go up as one blob per tier, the table comes down; a tier copies its
    # children's keys once (n keys at the root, spread over the shards); the whole table
    # (n addresses) goes down each tier to every child
    rendezvous = (n * c.key / shards + sum(k * 2 * c.request for k in tier) + fan + 3 * hop
                  + sum(tier) * n * ADDRESS_BYTES / bw)
    return {
        "heartbeat core share": groups / beat_s * c.beat,
        "event fan-out s": fan,
        "shrink agreement s": agree,
        "rendezvous s": rendezvous,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="4096,16384,102400")
    parser.add_argument("--from-json", type=Path, default=None)
    parser.add_argument("--beat-s", type=float, default=0.25, help="rank heartbeat interval")
    parser.add_argument("--hop-ms", type=float, default=0.2, help="one network hop")
    parser.add_argument("--bw-gbs", type=float, default=1.0, help="bytes a server sends, GB/s")
    parser.add_argument("--node", type=int, default=8, help="ranks per node agent")
    parser.add_argument("--group", type=int, default=64, help="node agents per aggregator")
    parser.add_argument("--shards", type=int, default=8, help="root store shards")
    args = parser.parse_args()
    c = costs_from(args.from_json) if args.from_json else Costs()
    hop, bw = args.hop_ms / 1e3, args.bw_gbs * 1e9
    print(f"per-message server CPU: heartbeat {c.beat * 1e6:.1f} µs, request {c.request * 1e6:.1f} µs, "
          f"event delivery {c.event * 1e6:.1f} µs, key read {c.key * 1e6:.2f} µs ({c.source})")
    print(f"ranks beat every {args.beat_s} s; hop {args.hop_ms} ms; hierarchy: {args.node} ranks/node agent, "
          f"{args.group} agents/aggregator, {args.shards} root shards; {args.bw_gbs} GB/s sent per server")
    print("| ranks | design | heartbeat core share | event fan-out s | shrink agreement s | rendezvous s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for n in (int(x) for x in args.ranks.split(",")):
        for name, row in (("flat", flat(n, c, args.beat_s, hop, bw)),
                          ("hierarchical", hierarchical(n, c, args.beat_s, hop, bw, args.node, args.group,
                                                        args.shards))):
            print(f"| {n} | {name} | {100 * row['heartbeat core share']:.1f} % | {row['event fan-out s']:.4f} | "
                  f"{row['shrink agreement s']:.4f} | {row['rendezvous s']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
