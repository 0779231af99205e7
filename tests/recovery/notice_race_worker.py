"""One rank of the notice-race job (run under ``torchcomms-run --on-failure shrink``, 3 ranks).

Rank 0 enters an op whose pre-hook holds it between the communicator's usability check and
the op being tracked in flight, until the failure notice of rank 2 (SIGKILLed meanwhile) has
broken the communicator. Rank 1 never enters the op, so the engine op of rank 0 can only end
through the notice. ``TC_RACE_CFG`` (JSON): ``op`` (``recv`` or ``all_reduce``), ``dir``,
``timeout_s``. Rank 0 writes ``result0.json``.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch

import torchcomms
from torchcomms import ReduceOp

CFG = json.loads(os.environ["TC_RACE_CFG"])
OUT = Path(CFG["dir"])


def _wait_file(path: Path, limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while not path.exists():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def main() -> int:
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "race", timeout=timedelta(seconds=CFG["timeout_s"]))
    me = comm.get_rank()
    warm = torch.ones(4)
    comm.all_reduce(warm, ReduceOp.SUM, False)
    if me == 2:
        _wait_file(OUT / "entered", 60)
        os.kill(os.getpid(), signal.SIGKILL)
    if me == 1:
        _wait_file(OUT / "result0.json", 90)
        return 0
    seen: dict = {}

    def hold_until_broken(name, op_id, rec) -> None:  # noqa: ANN001 - a pre-hook
        (OUT / "entered").touch()
        end = time.monotonic() + 30
        while not comm.is_broken() and time.monotonic() < end:
            time.sleep(0.005)
        seen["broken_in_hook"] = comm.is_broken()

    comm.register_pre_hook(hold_until_broken)
    t = torch.zeros(1024)
    result: dict = {}
    t0 = time.monotonic()
    try:
        if CFG["op"] == "recv":
            comm.recv(t, 1, False)
        else:
            comm.all_reduce(t, ReduceOp.SUM, False)
        result["raised"] = None
    except torchcomms.CommError as e:
        result["raised"] = type(e).__name__
        result["failed_ranks"] = getattr(e, "failed_ranks", None)
        result["message"] = str(e)
    result["after_broken_s"] = time.monotonic() - t0
    result.update(seen)
    (OUT / "result0.json.tmp").write_text(json.dumps(result))
    os.replace(OUT / "result0.json.tmp", OUT / "result0.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
