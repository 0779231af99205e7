"""Rank 0 telling the others through the default store that it is done."""
from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist


def done_through_the_store(store: dist.Store, timeout: timedelta) -> None:
    """Rank 0 marks ``tc-test/done``; every other rank waits for it (at most ``timeout``). Rank 0
    hosts the store (``init_process_group``'s TCPStore): it returns only once every other rank has
    read the mark, for a store that closes under a waiting rank fails its wait ("Failed to recv,
    got 0 bytes")."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        store.set("tc-test/done", "1")
        store.wait([f"tc-test/read{r}" for r in range(1, size)], timeout)
    else:
        store.wait(["tc-test/done"], timeout)
        store.set(f"tc-test/read{rank}", "1")
