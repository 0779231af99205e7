"""Rank bodies: ``torch.distributed.monitored_barrier`` on our communicators."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tests.dist.store_sync import done_through_the_store


def monitored(wait_all_ranks: bool) -> dict[str, Any]:
    """Every rank passes three monitored barriers; then only rank 0 enters one (3 s), while the
    others wait for it to be done through the store (rank 0, the store's host, leaves last)."""
    dist.init_process_group("gloo")
    store = dist.distributed_c10d._get_default_store()
    dist.monitored_barrier(timeout=timedelta(seconds=60))
    dist.monitored_barrier(wait_all_ranks=True)
    dist.monitored_barrier()
    t = torch.ones(2)
    dist.all_reduce(t)
    out: dict[str, Any] = {"sum": t.tolist()}
    if dist.get_rank() == 0:
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=3), wait_all_ranks=wait_all_ranks)
            out["error"] = None
        except Exception as e:  # noqa: BLE001 - reported to the test
            out.update(error=type(e).__name__, mro=[c.__name__ for c in type(e).__mro__], message=str(e),
                       missing=getattr(e, "missing_ranks", None))
    done_through_the_store(store, timedelta(seconds=120))
    dist.destroy_process_group()
    return out
