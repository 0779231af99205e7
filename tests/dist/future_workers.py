"""Rank bodies: ``Work.get_future()`` through ``torch.distributed`` on our communicators."""
from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

import torch
import torch.distributed as dist

from tests.dist.store_sync import done_through_the_store
from tests.helpers.torch_versions import TORCH_2_13

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


def failed_future_rethrows() -> dict[str, Any]:
    """Rank 0's all-reduce times out (rank 1 never joins it, and leaves once rank 0 is done):
    its future's error, asked for again and again, and through a ``then`` callback."""
    from datetime import timedelta

    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    store = dist.distributed_c10d._get_default_store()
    out: dict[str, Any] = {}
    if dist.get_rank() == 0:
        work = dist.all_reduce(torch.ones(4), async_op=True)
        fut = work.get_future()
        seen: list[str] = []
        for ask in (fut.wait, fut.wait, fut.value, fut.wait):
            try:
                ask()
                seen.append("no error")
            except Exception as e:  # noqa: BLE001 - reported to the test
                seen.append(type(e).__name__)
        chained = fut.then(lambda f: f.value())
        try:
            chained.wait()
            out["then"] = "no error"
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["then"] = f"{type(e).__name__}: {e}"
        out["seen"] = seen
        if TORCH_2_13:  # torch 2.11's binding of Work.exception cannot return an exception_ptr
            out["exception"] = type(work.exception()).__name__
    done_through_the_store(store, timedelta(seconds=60))
    dist.destroy_process_group()
    return out


def future_values() -> dict[str, Any]:
    """The values of the futures (and works' results) of ``all_gather_into_tensor``,
    ``all_gather`` and ``all_reduce``: each tensor's values, and for the first, whether each
    tensor is a view of the output (at the offset of its chunk)."""
    dist.init_process_group("gloo")
    r = dist.get_rank()
    x = torch.full((2,), float(r + 1))
    out = torch.zeros(4)
    work = dist.all_gather_into_tensor(out, x, async_op=True)
    value = work.get_future().wait()
    work.wait()  # c10d's gloo gives result() only once wait() returned
    res: dict[str, Any] = {
        "all_gather_into_tensor": [t.tolist() for t in value],
        "views": [t.data_ptr() == out[2 * i:].data_ptr() if len(value) > 1 else t.data_ptr() == out.data_ptr()
                  for i, t in enumerate(value)],
        "result": [t.tolist() for t in work.result()],
    }
    outs = [torch.zeros(2), torch.zeros(2)]
    res["all_gather"] = [t.tolist() for t in dist.all_gather(outs, x, async_op=True).get_future().wait()]
    res["all_reduce"] = [t.tolist() for t in dist.all_reduce(x.clone(), async_op=True).get_future().wait()]
    dist.destroy_process_group()
    return res
