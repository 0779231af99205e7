"""Rank bodies for receives from any source: on a bare communicator and through torch.distributed."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

import torchcomms

#: messages each sender sends to rank 0, in order
PER_SENDER = {1: 2, 2: 3}


def bare_any_source(backend: str = "gloo") -> dict[str, Any]:
    """Rank 0 posts receives from any source mixed with one named receive (from rank 2); ranks 1
    and 2 send their messages ``[sender, k]`` in order. Then a size mismatch on an any-source
    receive, and an any-source receive nobody answers (its deadline)."""
    c = torchcomms.new_comm(backend, torch.device("cpu"), "anysource")
    r = c.get_rank()
    out: dict[str, Any] = {"rank": r}
    if r == 0:
        kinds = ["any", 2, "any", "any", "any"]
        bufs = [torch.full((2,), -1, dtype=torch.int64) for _ in kinds]
        works = [c.recv_any_source(b, True) if k == "any" else c.recv(b, k, True) for k, b in zip(kinds, bufs)]
        for w in works:
            w.wait()
        out["received"] = [b.tolist() for b in bufs]
        out["sources"] = [w.source_rank() for w in works]
        out["kinds"] = [str(k) for k in kinds]
        out["record_peers"] = [w.record.peer for w in works]
        c.barrier(False)
        # a sender whose message does not fit: the receive names it
        try:
            c.recv_any_source(torch.empty(2, dtype=torch.int64), False)
            out["mismatch"] = None
        except torchcomms.CommError as e:
            out["mismatch"] = [type(e).__name__, str(e)]
        return out
    for k in range(PER_SENDER[r]):
        c.send(torch.tensor([r, k], dtype=torch.int64), 0, False)
    c.barrier(False)
    if r == 1:
        c.send(torch.zeros(3, dtype=torch.int64), 0, False)
    return out


def bare_any_source_deadline(backend: str = "gloo") -> dict[str, Any]:
    """Nobody sends: rank 0's receive from any source ends at its deadline with our typed error."""
    import time

    c = torchcomms.new_comm(backend, torch.device("cpu"), "anysource-deadline")
    if c.get_rank() != 0:
        time.sleep(4.0)
        return {}
    start = time.monotonic()
    try:
        c.recv_any_source(torch.empty(1), False, timeout=timedelta(seconds=1.5))
        return {"error": None}
    except torchcomms.CommError as e:
        return {"error": type(e).__name__, "secs": time.monotonic() - start}


def c10d_any_source() -> dict[str, Any]:
    """``dist.recv(t)`` and ``dist.irecv(t)`` without a source (torch.distributed's own API)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {"backend": type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__}
    if r == 0:
        got = []
        for _ in range(n - 1):
            t = torch.zeros(3)
            src = dist.recv(t)
            got.append([src, t.tolist()])
        out["recv"] = sorted(got)
        dist.barrier()
        t = torch.zeros(3)
        work = dist.irecv(t)
        work.wait()
        out["irecv"] = [work._source_rank(), t.tolist()]
    else:
        dist.send(torch.full((3,), float(r)), 0)
        dist.barrier()
        if r == n - 1:
            dist.send(torch.full((3,), 10.0 * r), 0)
    dist.destroy_process_group()
    return out
