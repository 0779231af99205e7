"""Write synthetic flight-recorder dumps of a large job, in the real format.

    python3 benchmarks/trace_dumps_gen.py OUT_DIR --ranks 1024 --entries 2048

Each rank's dump is built by the recorder's own writer (``torchcomms.tracing.fr_format``:
``EntryView`` -> ``build_dump`` -> ``to_pickle``, the bytes ``FlightRecorder.dump_file``
writes) and saved as ``OUT_DIR/fr_rank_<r>``. The job: a world communicator ``0`` running a
cycle of all_reduce / all_gather / reduce_scatter / broadcast, per-node communicators of
``--node-size`` ranks (``node<k>``) running all_reduce, and pipeline send/recv between
neighbouring nodes on the world communicator. Known problems are planted so that an analysis
has something to find: rank ``--late-rank`` arrives late at every world collective (a
straggler) and never enters the last one (a hang), and rank ``--mismatch-rank`` passes a
different size to world collective ``--mismatch-seq``.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchcomms.tracing import fr_format  # noqa: E402
from torchcomms.tracing.fr_format import CommInfo, DumpContext, EntryView  # noqa: E402

WORLD_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
T0_NS = 1_800_000_000_000_000_000
STEP_NS = 2_000_000  # one op every 2 ms
FRAMES = [
    {"name": "train_step", "filename": "train.py", "line": 88},
    {"name": "forward", "filename": "model.py", "line": 412},
    {"name": "<module>", "filename": "train.py", "line": 140},
]


def plan(rank: int, args: argparse.Namespace) -> list[tuple[str, str, int, int | None]]:
    """The op sequence of ``rank``: (comm, op, per-comm seq, peer) for each entry."""
    ops: list[tuple[str, str, int, int | None]] = []
    node, nodes = rank // args.node_size, args.ranks // args.node_size
    seqs = {"0": 0, f"node{node}": 0}
    p2p = 0
    i = 0
    while len(ops) < args.entries:
        kind = i % 8
        i += 1
        if kind in (3, 7):
            comm = f"node{node}"
            seqs[comm] += 1
            ops.append((comm, "all_reduce", seqs[comm], None))
        elif kind == 5 and nodes > 1:
            local = rank % args.node_size
            nxt, prv = (node + 1) % nodes, (node - 1) % nodes
            # even nodes send first, odd nodes receive first: every send meets its recv
            first, second = (("send", nxt), ("recv", prv)) if node % 2 == 0 else (("recv", prv), ("send", nxt))
            for name, peer_node in (first, second):
                if len(ops) < args.entries:
                    p2p += 1
                    ops.append(("0", name, p2p, peer_node * args.node_size + local))
        else:
            seqs["0"] += 1
            ops.append(("0", WORLD_OPS[seqs["0"] % len(WORLD_OPS)], seqs["0"], None))
    return ops


def dump_of(rank: int, args: argparse.Namespace) -> bytes:
    world = CommInfo("0", tuple(range(args.ranks)), rank, "nccl", "default_pg")
    node = rank // args.node_size
    local = CommInfo(f"node{node}", tuple(range(node * args.node_size, (node + 1) * args.node_size)),
                     rank % args.node_size, "nccl", f"node{node}", parent="0")
    comms = {"0": world, local.name: local}
    steps = plan(rank, args)
    last_world = max(seq for comm, op, seq, _ in steps if comm == "0" and op not in ("send", "recv"))
    entries: list[EntryView] = []
    coll_ids = {"0": 0, local.name: 0}
    for index, (comm_name, op, seq, peer) in enumerate(steps):
        comm = comms[comm_name]
        is_p2p = op in ("send", "recv")
        if comm_name == "0" and not is_p2p and rank == args.late_rank and seq == last_world:
            break  # the planted hang: this rank never enters the world's last collective
        created = T0_NS + index * STEP_NS + (rank % 7) * 1_000
        if rank == args.late_rank and comm_name == "0":
            created += 500_000  # the planted straggler: 0.5 ms late
        size = 1 << (12 + seq % 8)
        if rank == args.mismatch_rank and comm_name == "0" and seq == args.mismatch_seq:
            size += 1
        out = size * len(comm.ranks) if op == "all_gather" else size
        out = size // len(comm.ranks) or 1 if op == "reduce_scatter" else out
        in_flight = comm_name == "0" and not is_p2p and seq == last_world
        if not is_p2p:
            coll_ids[comm_name] += 1
        entries.append(EntryView(
            record_id=index, comm=comm, op=op, seq=seq,
            collective_seq_id=0 if is_p2p else seq, p2p_seq_id=seq if is_p2p else 0,
            op_id=index + 1, is_p2p=is_p2p, peer=peer, root=0 if op == "broadcast" else None,
            reduce_op="SUM" if op in ("all_reduce", "reduce_scatter") else None,
            input_sizes=[[size]], input_dtypes=["float32"], output_sizes=[[out]],
            output_dtypes=["float32"], timeout_s=600.0, time_created_ns=created,
            time_started_ns=created + 20_000,
            time_completed_ns=None if in_flight else created + 900_000 + (seq % 5) * 10_000,
            state="started" if in_flight else "completed", error=None,
            thread_name="MainThread", thread_id=1, frames=FRAMES))
    ctx = DumpContext(rank=rank, world_size=args.ranks, run_id="scale-synthetic",
                      reason="signal", comm_lib_version="synthetic", host=f"node{node:04d}",
                      pid=10_000 + rank)
    return fr_format.to_pickle(fr_format.build_dump(entries, comms.values(), ctx))


def _write(job: tuple[int, argparse.Namespace]) -> int:
    rank, args = job
    data = dump_of(rank, args)
    (Path(args.out) / f"fr_rank_{rank}").write_bytes(data)
    return len(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--entries", type=int, default=2048)
    parser.add_argument("--node-size", type=int, default=8)
    parser.add_argument("--late-rank", type=int, default=None, help="default: ranks * 3 // 4 + 5")
    parser.add_argument("--mismatch-rank", type=int, default=None, help="default: 3")
    parser.add_argument("--mismatch-seq", type=int, default=100)
    parser.add_argument("--procs", type=int, default=2)
    args = parser.parse_args(argv)
    if args.ranks % args.node_size:
        parser.error("--ranks must be a multiple of --node-size")
    if args.late_rank is None:
        args.late_rank = min(args.ranks - 1, args.ranks * 3 // 4 + 5)
    if args.mismatch_rank is None:
        args.mismatch_rank = min(3, args.ranks - 1)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    jobs = [(r, args) for r in range(args.ranks)]
    if args.procs > 1:
        with mp.get_context("fork").Pool(args.procs) as pool:
            sizes = pool.map(_write, jobs, chunksize=8)
    else:
        sizes = [_write(job) for job in jobs]
    print(f"wrote {len(sizes)} dumps ({sum(sizes) / 2**20:.1f} MiB) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
