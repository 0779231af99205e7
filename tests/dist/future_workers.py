"""Rank bodies: ``Work.get_future()`` through ``torch.distributed`` on our communicators."""
from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

import torch
import torch.distributed as dist

FUTURES_THREAD = "torchcomms-c10d-futures:"


def _released(ref: weakref.ref, within_s: float = 30.0) -> bool:
    """Whether the object behind ``ref`` is freed (given the futures thread time to let go)."""
    end = time.monotonic() + within_s
    while ref() is not None and time.monotonic() < end:
        gc.collect()
        time.sleep(0.05)
    return ref() is None


def future_keeps_nothing() -> dict[str, Any]:
    """Rank 0 asks for the future of an all-reduce that cannot have completed yet (rank 1 joins
    it only after rank 0 says so through the store), so the future is completed by the
    forwarder's completion thread. Once the program dropped the tensor, the work and the future,
    nothing may keep the tensor alive; after ``destroy_process_group`` that thread has ended."""
    dist.init_process_group("gloo")
    store = dist.distributed_c10d._get_default_store()
    r = dist.get_rank()
    out: dict[str, Any] = {}
    if r == 0:
        t = torch.ones(1 << 16)
        work = dist.all_reduce(t, async_op=True)
        fut = work.get_future()
        out["queued"] = not fut.done()
        store.set("tc-test/go", "1")
        out["value"] = fut.wait()[0][0].item()
        ref = weakref.ref(t)
        del t, work, fut
        out["tensor_released"] = _released(ref)
    else:
        store.wait(["tc-test/go"])
        t = torch.ones(1 << 16)
        dist.all_reduce(t)
        out["value"] = t[0].item()
    dist.destroy_process_group()
    out["futures_threads_left"] = [th.name for th in threading.enumerate() if th.name.startswith(FUTURES_THREAD)]
    return out
