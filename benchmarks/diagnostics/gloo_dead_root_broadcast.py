"""c10d's own gloo, no torchcomms: three ranks broadcast 16 MiB in a loop, the root of the
third SIGKILLs itself while it is in flight. Each survivor prints how its wait ended: on torch
2.13 they mostly waited out the group's timeout ("Timed out waiting ... for recv operation"),
although the root's connection was gone: gloo's receives into unbound buffers do not fail on a
connection that closed. torchcomms inherits that for gloo's broadcast, all-gather, all-to-all
and point to point (see INTERNALS, "Recovery").

    python3 benchmarks/diagnostics/gloo_dead_root_broadcast.py --timeout 10
"""
from __future__ import annotations

import argparse
import datetime
import os
import signal
import socket
import subprocess
import sys
import time

NUMEL = 4 * 1024 * 1024
WORLD = 3
VICTIM = 2  # the root of the third broadcast


def rank_main(rank: int, port: int, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=datetime.timedelta(seconds=60))
    pg = dist.ProcessGroupGloo(store, rank, WORLD, datetime.timedelta(seconds=timeout_s))

    def broadcast(step: int) -> dist.Work:
        opts = dist.BroadcastOptions()
        opts.rootRank = step % WORLD
        return pg.broadcast([torch.ones(NUMEL)], opts)

    for step in range(2):
        broadcast(step).wait()
    if rank == VICTIM:
        broadcast(2)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    step = 2
    try:
        for step in range(2, 1000):
            broadcast(step).wait()
        print(f"rank {rank}: no error", flush=True)
    except RuntimeError as e:
        print(f"rank {rank}: broadcast {step + 1} failed after {time.monotonic() - start:.2f} s: {str(e)[:110]}",
              flush=True)
    time.sleep(timeout_s + 5)  # alive until the other survivor's wait ended too


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--timeout", type=float, default=10.0, help="the process group's timeout (s)")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.timeout)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port),
                               "--timeout", str(args.timeout)]) for r in range(WORLD)]
    for proc in procs:
        proc.wait()


if __name__ == "__main__":
    main()
