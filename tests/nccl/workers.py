"""Code that runs inside rank processes for the nccl tests (see tests/helpers/ranks.py)."""
from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import torchcomms
from torchcomms import CommTimeoutError, PeerFailureError, ReduceOp


def peer_never_joins(timeout_s: float) -> dict[str, Any]:
    """Rank 0 of a 2-rank communicator whose rank 1 never starts: ``new_comm`` must raise
    ``CommTimeoutError`` by the timeout, and the process must then build a working one."""
    store = dist.HashStore()  # the unique-id exchange succeeds; NCCL's own rendezvous waits on rank 1
    t0 = time.monotonic()
    try:
        torchcomms.new_comm("nccl", torch.device("cuda", 0), name="lonely", store=store,
                            timeout=timedelta(seconds=timeout_s), hints={"rank": "0", "size": "2"})
    except CommTimeoutError as e:
        raised, elapsed, message = "CommTimeoutError", time.monotonic() - t0, str(e)
    else:
        raise AssertionError("new_comm returned although rank 1 never joined")
    comm = torchcomms.new_comm("nccl", torch.device("cuda", 0), name="after", hints={"rank": "0", "size": "1"})
    t = torch.full((4,), 5.0, device="cuda")
    comm.all_reduce(t, ReduceOp.SUM, False)
    torch.cuda.synchronize()
    comm.finalize()
    return {"raised": raised, "elapsed": elapsed, "message": message, "after": t.tolist()}


def every_op(numel: int = 4096) -> dict[str, Any]:
    """Every collective on N ranks (one GPU each) against values computed on the host."""
    rank, n = int(os.environ["TORCHCOMM_RANK"]), int(os.environ["TORCHCOMM_SIZE"])
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    comm = torchcomms.new_comm("nccl", dev, name="every-op", timeout=timedelta(seconds=60))

    def val(r: int, k: int = 0) -> torch.Tensor:
        return (torch.arange(numel, device=dev) % 7 + r + k).float()

    t = val(rank)
    comm.all_reduce(t, ReduceOp.SUM, False)
    assert torch.equal(t, sum(val(r) for r in range(n)))
    t = val(rank)
    comm.all_reduce(t, ReduceOp.AVG, False)
    assert torch.allclose(t, sum(val(r) for r in range(n)) / n)
    t = val(rank)
    comm.broadcast(t, n - 1, False)
    assert torch.equal(t, val(n - 1))
    out = torch.empty(numel * n, device=dev)
    comm.all_gather_single(out, val(rank), False)
    assert torch.equal(out, torch.cat([val(r) for r in range(n)]))
    outs = [torch.empty((r + 1) * 3, device=dev) for r in range(n)]
    comm.all_gather_v(outs, torch.full(((rank + 1) * 3,), float(rank), device=dev), False)
    assert all(torch.all(o == r) for r, o in enumerate(outs))
    rs = torch.empty(numel, device=dev)
    comm.reduce_scatter_single(rs, torch.cat([val(rank, k) for k in range(n)]), ReduceOp.SUM, False)
    assert torch.equal(rs, sum(val(r, rank) for r in range(n)))
    a2a = torch.empty(numel * n, device=dev)
    comm.all_to_all_single(a2a, torch.cat([val(rank, k) for k in range(n)]), False)
    assert torch.equal(a2a, torch.cat([val(r, rank) for r in range(n)]))
    peer = (rank + 1) % n
    src = (rank - 1) % n
    got = torch.empty(numel, device=dev)
    batch = comm.batch_op_create()
    batch.send(val(rank), peer)
    batch.recv(got, src)
    batch.issue(False)
    assert torch.equal(got, val(src))
    if rank == 0:
        comm.send(val(rank, 9), 1, False)
    elif rank == 1:
        r0 = torch.empty(numel, device=dev)
        comm.recv(r0, 0, False)
        assert torch.equal(r0, val(0, 9))
    comm.barrier(False)
    members = list(range(0, n, 2))
    child = comm.split(members if rank in members else [], "every-op-even")
    if rank in members:
        c = torch.ones(8, device=dev)
        child.all_reduce(c, ReduceOp.SUM, False)
        assert torch.all(c == len(members))
        child.finalize()
    else:
        assert child is None
    torch.cuda.synchronize()
    comm.finalize()
    return {"ok": True}


def op_timeout_then_shrink(straggler: int) -> dict[str, Any]:
    """Rank ``straggler`` never calls the all-reduce and exits: the others time out within
    timeout + 1 s, then shrink (ncclCommShrink) to the survivors and carry on."""
    rank, n = int(os.environ["TORCHCOMM_RANK"]), int(os.environ["TORCHCOMM_SIZE"])
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    comm = torchcomms.new_comm("nccl", dev, name="shrinking", timeout=timedelta(seconds=30))
    comm.barrier(False)
    torch.cuda.synchronize()
    if rank == straggler:
        time.sleep(1.0)
        os._exit(0)
    t0 = time.monotonic()
    w = comm.all_reduce(torch.ones(1024, device=dev), ReduceOp.SUM, True, timeout=timedelta(seconds=2))
    try:
        w.wait_blocking()
    except (CommTimeoutError, PeerFailureError):  # NCCL may see the peer's exit before the deadline
        elapsed = time.monotonic() - t0
    else:
        raise AssertionError("the all-reduce completed without the straggler")
    new = comm.shrink(timeout=timedelta(seconds=30))
    t = torch.ones(16, device=dev)
    new.all_reduce(t, ReduceOp.SUM, False)
    torch.cuda.synchronize()
    new.finalize()
    return {"timeout_elapsed": elapsed, "new_size": new.get_size(), "sum": t[0].item()}
