"""Rank programs for the tests of recovery without the launcher: env vars and a TCPStore
hosted by the test process (``TC_STORE_PORT``), no control plane."""
from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import torchcomms
from torchcomms import ReduceOp

NUMEL = 4 * 1024 * 1024  # 16 MiB of float32


def kill_inside_all_reduce(victim: int, op_timeout_s: float) -> dict[str, Any]:
    """Every rank runs 16 MiB all_reduces; ``victim`` SIGKILLs itself while one is in flight
    (its engine is inside it) after writing the wall-clock time of the kill to
    ``$TC_READY_DIR/killed``. A survivor reports when and how its op failed, then shrinks and
    checks that an all_reduce over the survivors is correct."""
    ready_dir = os.environ["TC_READY_DIR"]
    world = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore("127.0.0.1", int(os.environ["TC_STORE_PORT"]), world, False,
                          timeout=timedelta(seconds=120), wait_for_workers=False)
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "nolaunch", timeout=timedelta(seconds=120), store=store)
    me = comm.get_rank()
    t = torch.ones(NUMEL)
    comm.all_reduce(t, ReduceOp.SUM, False)
    assert t[0].item() == world
    comm.set_timeout(timedelta(seconds=op_timeout_s))
    if me == victim:
        comm.all_reduce(t, ReduceOp.SUM, True)  # in flight in the engine: the peers are inside it too
        time.sleep(0.01)
        with open(os.path.join(ready_dir, "killed.tmp"), "w") as f:
            f.write(repr(time.time()))
        os.replace(os.path.join(ready_dir, "killed.tmp"), os.path.join(ready_dir, "killed"))
        os.kill(os.getpid(), signal.SIGKILL)
    out: dict[str, Any] = {"rank": me}
    try:
        for _ in range(100000):
            comm.all_reduce(t, ReduceOp.SUM, False)
            t.fill_(1.0)
        out["raised"] = None
    except torchcomms.CommError as e:
        out.update(raised=type(e).__name__, at=time.time(), message=str(e)[:500],
                   failed_ranks=getattr(e, "failed_ranks", None))
    t0 = time.monotonic()
    try:
        new = comm.shrink(timeout=timedelta(seconds=op_timeout_s))
    except torchcomms.CommError as e:
        out.update(shrink=type(e).__name__, shrink_message=str(e)[:500])
        return out
    out["shrink_s"] = time.monotonic() - t0
    x = torch.full((NUMEL,), float(me + 1))
    new.all_reduce(x, ReduceOp.SUM, False)
    out.update(shrink="ok", new_size=new.get_size(), sum=x[0].item(), uniform=bool((x == x[0]).all().item()))
    new.finalize()
    return out


