"""One rank of a chaos job (run under ``torchcomms-run --on-failure shrink``).

Config comes as JSON in ``TC_CHAOS_CFG``: ``op`` (the collective run each step), ``victim``
(global rank that fails), ``signal`` (KILL, STOP or TERM), ``when`` (``between`` ops or
``inside`` the op), ``step`` (when), ``second_victim`` (fails while the others shrink, or -1),
``second_at`` (``agree``, the default: at a random instant of the shrink's start; ``build``: after
it agreed on the survivors, while the survivors' engine is being built), ``dir`` (where results
go), ``timeout_s``. Each survivor writes ``result<rank>.json``.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from datetime import timedelta

import torch

import torchcomms
from torchcomms import ReduceOp

CFG = json.loads(os.environ["TC_CHAOS_CFG"])
OUT = CFG["dir"]
SIGS = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP, "TERM": signal.SIGTERM}


def write(name: str, data: dict) -> None:
    tmp = os.path.join(OUT, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(OUT, name))


def die(rank: int) -> None:
    write(f"failed{rank}.json", {"t": time.time(), "pid": os.getpid()})
    os.kill(os.getpid(), SIGS[CFG["signal"]])
    time.sleep(3600)  # STOP resumes here only if someone sends SIGCONT


def die_while_building(rank: int) -> None:
    """Take part in the shrink's agreement (the others count this rank among the survivors),
    then die at a random instant of the engine's build over them."""
    from torchcomms.recovery import shrink as shrink_module

    build = shrink_module._build_engine

    def build_then_die(*args: object, **kwargs: object) -> object:
        threading.Thread(target=build, args=args, kwargs=kwargs, daemon=True).start()
        time.sleep(random.uniform(0.0, 0.05))
        die(rank)

    shrink_module._build_engine = build_then_die


def check_or_shrink_again(comm: torchcomms.TorchComm) -> torchcomms.TorchComm:
    """A shrink may end before a second rank's death inside it: then the survivors' next
    collective reports that rank, and they shrink once more (what a training loop does)."""
    try:
        comm.barrier(False)
        return comm
    except torchcomms.PeerFailureError:
        return comm.shrink()


def run_op(comm: torchcomms.TorchComm, op: str, async_op: bool = False) -> tuple[torchcomms.TorchWork, object]:
    n, r = comm.get_size(), comm.get_rank()
    if op == "all_reduce":
        t = torch.full((4096,), float(r + 1))
        return comm.all_reduce(t, ReduceOp.SUM, async_op), (t, float(n * (n + 1) / 2))
    if op == "all_gather_single":
        t = torch.full((1024,), float(r))
        out = torch.empty(1024 * n)
        return comm.all_gather_single(out, t, async_op), (out, None)
    if op == "reduce_scatter_single":
        t = torch.ones(1024 * n)
        out = torch.empty(1024)
        return comm.reduce_scatter_single(out, t, ReduceOp.SUM, async_op), (out, float(n))
    if op == "barrier":
        return comm.barrier(async_op), (None, None)
    raise ValueError(op)


def main() -> int:
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "chaos", timeout=timedelta(seconds=CFG["timeout_s"]))
    me = comm.get_rank()
    write(f"pid{me}.json", {"pid": os.getpid()})
    victim, second = CFG["victim"], CFG.get("second_victim", -1)
    result: dict = {"rank": me}
    try:
        for step in range(CFG["step"] + 3):
            if me == victim and step == CFG["step"] and CFG["when"] == "between":
                die(me)
            work, _ = run_op(comm, CFG["op"], async_op=True)
            if me == victim and step == CFG["step"] and CFG["when"] == "inside":
                die(me)
            work.wait()
        result["raised"] = None
    except torchcomms.CommError as e:
        result["raised"] = type(e).__name__
        result["message"] = str(e)
        result["t_detect"] = time.time()
        result["failed_ranks"] = getattr(e, "failed_ranks", None)
        result["detected_by"] = getattr(e, "detected_by", None)
    if me == second and CFG.get("second_at", "agree") == "build":
        die_while_building(me)
    elif me == second:
        time.sleep(random.uniform(0.0, 0.03))
        die(me)
    t0 = time.time()
    try:
        new = comm.shrink()
        if CFG.get("second_at") == "build":
            new = check_or_shrink_again(new)
    except torchcomms.CommError as e:
        result["shrink_error"] = f"{type(e).__name__}: {e}"
        write(f"result{me}.json", result)
        return 0
    result["t_shrunk"] = time.time()
    result["shrink_s"] = result["t_shrunk"] - t0
    result["survivors"] = new.get_global_ranks()
    result["new_rank"], result["new_size"] = new.get_rank(), new.get_size()
    # the old communicator refuses everything at once
    t1 = time.monotonic()
    try:
        comm.barrier(False)
        result["old_after"] = None
    except torchcomms.CommError as e:
        result["old_after"] = type(e).__name__
    result["old_after_s"] = time.monotonic() - t1
    # the first collective on the shrunk communicator is correct
    t = torch.tensor([float(me)])
    new.all_reduce(t, ReduceOp.SUM, False)
    result["t_first_op"] = time.time()
    result["first_sum"] = t.item()
    result["first_ok"] = t.item() == float(sum(result["survivors"]))
    work, (buf, want) = run_op(new, CFG["op"])
    result["op_ok"] = want is None or bool(torch.all(buf == want))
    write(f"result{me}.json", result)
    new.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
