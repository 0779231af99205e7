"""Cost of framing gloo point-to-point (a 32-byte header before each payload, see
torchcomms/backends/gloo_p2p.py) per message, on 2 local ranks.

    python3 benchmarks/p2p_frame_bench.py [--iters 300] [--rounds 5] [--sizes 4,65536,4194304]

A ping-pong (rank 0 sends, rank 1 receives and sends back) timed per round trip, in rounds
whose contender order alternates. Contenders, on one engine:

- ``raw``: ``ProcessGroupGloo.send/recv`` + ``wait()`` on the engine's own process group — the
  anchor;
- ``framed``: the engine's framed ``send``/``recv`` (header then payload, what every torchcomms
  send/recv does), waited on their futures;
- ``framed+check``: the same with ``TORCHCOMM_CHECK_COLLECTIVES=1`` (the receiver answers each
  header; the sender waits for the answer), measured in a second pair of ranks.

Prints the median over rounds of the mean round trip, and ratios to ``raw`` of the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _rank_main(iters: int, rounds: int, sizes: list[int]) -> None:
    import torch

    import torchcomms

    comm = torchcomms.new_comm("gloo", "cpu", "p2p-bench", timeout=timedelta(seconds=120))
    rank = comm.get_rank()
    peer = 1 - rank
    engine = comm._core.backend  # the engine under the communicator (framed ops)
    pg = engine.engine()  # its ProcessGroupGloo (raw ops)

    def raw(t: torch.Tensor) -> None:
        if rank == 0:
            pg.send([t], peer, 0).wait()
            pg.recv([t], peer, 0).wait()
        else:
            pg.recv([t], peer, 0).wait()
            pg.send([t], peer, 0).wait()

    def framed(t: torch.Tensor) -> None:
        if rank == 0:
            _wait(engine.send(t, peer, 0))
            _wait(engine.recv(t, peer, 0))
        else:
            _wait(engine.recv(t, peer, 0))
            _wait(engine.send(t, peer, 0))

    def _wait(handle) -> None:
        error = handle.wait_until(time.monotonic() + 60)
        if error is not None:
            raise error

    results: dict[str, dict[str, float]] = {}
    for n in sizes:
        t = torch.ones(max(1, n // 4))
        for fn in (raw, framed):
            for _ in range(20):
                fn(t)
        per: dict[str, list[float]] = {"raw": [], "framed": []}
        for r in range(rounds):
            order = [("raw", raw), ("framed", framed)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                comm.barrier(False)
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn(t)
                per[name].append((time.perf_counter() - t0) / iters * 1e6)
        results[str(n)] = {k: statistics.median(v) for k, v in per.items()}
    if rank == 0:
        print(json.dumps(results), flush=True)
    comm.finalize()


def _pair(args: argparse.Namespace, check: bool) -> dict[str, dict[str, float]]:
    from tests.helpers.ports import free_port

    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, TORCHCOMM_RANK=str(r), TORCHCOMM_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TORCHCOMM_CHECK_COLLECTIVES="1" if check else "0",
                   TORCHCOMM_TRACING_DISABLE="1",
                   PYTHONPATH=str(Path(__file__).resolve().parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-main", "--iters", str(args.iters),
                                       "--rounds", str(args.rounds), "--sizes", args.sizes],
                                      env=env, stdout=subprocess.PIPE, text=True))
    out = procs[0].communicate(timeout=1200)[0]
    procs[1].wait(timeout=60)
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="4,65536,4194304")
    ap.add_argument("--rank-main", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.rank_main:
        _rank_main(args.iters, args.rounds, sizes)
        return
    plain, check = _pair(args, False), _pair(args, True)
    print(f"load average {os.getloadavg()[0]:.1f}; round trip (2 messages) in µs, median of {args.rounds} rounds")
    print(f"{'bytes':>9} {'raw':>9} {'framed':>9} {'ratio':>6} {'+µs/msg':>8} | {'raw':>9} {'checked':>9} {'ratio':>6} {'+µs/msg':>8}")
    for n in sizes:
        a, b = plain[str(n)], check[str(n)]
        print(f"{n:>9} {a['raw']:>9.1f} {a['framed']:>9.1f} {a['framed'] / a['raw']:>6.2f} "
              f"{(a['framed'] - a['raw']) / 2:>8.1f} | {b['raw']:>9.1f} {b['framed']:>9.1f} "
              f"{b['framed'] / b['raw']:>6.2f} {(b['framed'] - b['raw']) / 2:>8.1f}")


if __name__ == "__main__":
    main()
