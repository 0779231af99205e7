"""Rank bodies for ``get_options().store``: the store a communicator met on."""
from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

import torchcomms


def options_store() -> dict[str, Any]:
    """A communicator that found its store (MASTER_ADDR:MASTER_PORT) exposes it; it is the
    store every rank met on (a key set by rank 0 reads back on rank 1), and a split child
    keeps it."""
    c = torchcomms.new_comm("gloo", torch.device("cpu"), "opts-store")
    store = c.get_options().store
    out: dict[str, Any] = {"type": type(store).__name__, "is_store": isinstance(store, dist.Store)}
    if c.get_rank() == 0:
        store.set("opts-store-probe", "from rank 0")
    c.barrier(False)
    out["read"] = store.get("opts-store-probe").decode()
    child = c.split([0, 1], "opts-store-child")
    out["child_same"] = child is not None and child.get_options().store is store
    child.finalize()
    given = dist.PrefixStore("given/", store)
    c2 = torchcomms.new_comm("gloo", torch.device("cpu"), "opts-store-given", store=given)
    out["given_kept"] = c2.get_options().store is given
    # every rank has its engine before any finalizes: a rank that finalized at once closed its
    # sockets while its peer still connected, and the peer's new_comm failed (PeerFailureError)
    c2.barrier(False)
    c2.finalize()
    c.finalize()
    return out


def attempt_under_agent_store(delay_s: float) -> list[float]:
    """One torchrun attempt's communicator on the agent's store (``TORCHELASTIC_USE_AGENT_STORE``):
    rank 0 starts ``delay_s`` late, so a rank that read an earlier attempt's keys would meet a
    rank 0 that is gone."""
    import os
    import time

    if int(os.environ["TORCHCOMM_RANK"]) == 0:
        time.sleep(delay_s)
    c = torchcomms.new_comm("gloo", torch.device("cpu"), "agent-store")
    t = torch.full((2,), float(c.get_rank() + 1))
    c.all_reduce(t, torchcomms.ReduceOp.SUM, False)
    c.finalize()
    return t.tolist()


def rank_claimed_twice() -> dict[str, Any]:
    """A process of a job where two were given rank 1: the second to claim it is refused at once.
    Rank 0 hosts the store, so it stays until all three processes are done with it (a refused
    process that started late would otherwise find no store at all)."""
    import time
    from datetime import timedelta

    timeout = timedelta(seconds=60)
    try:
        c = torchcomms.new_comm("gloo", torch.device("cpu"), "claimed", timeout=timeout)
    except torchcomms.CommValueError as e:
        out: dict[str, Any] = {"error": str(e)}
    else:
        t = torch.full((2,), float(c.get_rank() + 1))
        c.all_reduce(t, torchcomms.ReduceOp.SUM, False)
        c.finalize()
        out = {"sum": t.tolist()}
    store = torchcomms.job_store(timeout)
    store.add("claimed-done", 1)
    if int(os.environ["TORCHCOMM_RANK"]) == 0:
        deadline = time.monotonic() + 60
        while int(store.add("claimed-done", 0)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    return out


def beside_c10d_default_group() -> list[float]:
    """A communicator made after c10d's ``init_process_group`` met on MASTER_ADDR:MASTER_PORT
    (rank 0 already hosts that store: one of our own could not listen there)."""
    dist.init_process_group("gloo")
    try:
        c = torchcomms.new_comm("gloo", torch.device("cpu"), "beside-c10d")
        t = torch.full((2,), float(c.get_rank() + 1))
        c.all_reduce(t, torchcomms.ReduceOp.SUM, False)
        dist.all_reduce(t)
        c.finalize()
    finally:
        dist.destroy_process_group()
    return t.tolist()
