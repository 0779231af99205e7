"""One rank of a training job that uses the agreed recovery pattern (under ``torchcomms-run
--on-failure shrink``): every step's collective outcome is put to ``comm.agree``; the step is
applied only if every survivor's collective succeeded, otherwise all shrink and redo it.

``TC_STEP_CFG`` (JSON): ``steps``, ``dir``, ``timeout_s``; ``victim``/``kill_step`` (the victim
SIGKILLs itself at a uniformly random instant of that step; -1 for none); ``fail_rank``/
``fail_step`` (that rank treats its completed collective of that step as failed, the case of an
op that completed on some members and failed on others; -1 for none); ``gil_rank``/``gil_step``
(that healthy rank holds the GIL for 5 s in a C call, from a uniformly random instant of that
step; -1 for none: it must not be taken for hung). Each survivor writes ``result<rank>.json``;
the victim writes ``killed.json`` just before it dies, the GIL holder ``held.json`` after the hold.
"""
from __future__ import annotations

import ctypes
import hashlib
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

CFG = json.loads(os.environ["TC_STEP_CFG"])
OUT = CFG["dir"]


_DYING = threading.Lock()


def write(name: str, data: dict) -> None:
    tmp = os.path.join(OUT, f"{name}.{threading.get_ident()}.tmp")  # a file per writing thread
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(OUT, name))


def die(**why: object) -> None:
    """Write ``killed.json`` and SIGKILL this process, once: the drawn instant's timer and the
    end of a step shorter than the draw may both come (both wrote killed.json at once, and
    its two writes mixed into invalid JSON)."""
    if not _DYING.acquire(blocking=False):
        threading.Event().wait()  # the other path is ending the process
    write("killed.json", {"t": time.time(), **why})
    os.kill(os.getpid(), signal.SIGKILL)


def instant_of_a_step(durations: list[float]) -> float:
    """A uniformly random instant of a typical step (the median of the steps after the first,
    which warms up), in seconds from its start."""
    steady = sorted(durations[1:] or durations) or [0.05]
    return random.uniform(0.0, steady[len(steady) // 2])


def kill_after(delay_s: float) -> None:
    def _die() -> None:
        time.sleep(delay_s)
        die(delay_s=delay_s)
    threading.Thread(target=_die, daemon=True).start()


def hold_gil_after(delay_s: float, hold_s: float = 5.0) -> None:
    """From a side thread: after ``delay_s``, a C call that keeps the GIL for ``hold_s`` (a
    ``PyDLL`` call never releases it), so every Python thread of the rank stands still."""
    libc = ctypes.PyDLL(None)

    def _hold() -> None:
        time.sleep(delay_s)
        t0 = time.monotonic()
        libc.usleep(int(hold_s * 1e6))
        write("held.json", {"t": time.time(), "delay_s": delay_s, "held_s": time.monotonic() - t0})
    threading.Thread(target=_hold, daemon=True).start()


def main() -> int:
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "agreed", timeout=timedelta(seconds=CFG["timeout_s"]))
    me = comm.get_rank()  # the job rank: it never changes, the communicator's numbering may
    write(f"pid{me}.json", {"pid": os.getpid()})
    torch.manual_seed(0)
    w = torch.randn(256, 256)
    step, durations = 0, []
    res: dict = {"rank": me, "raised": [], "decisions": [], "shrinks": 0}
    while step < CFG["steps"]:
        t0 = time.monotonic()
        if me == CFG["victim"] and step == CFG["kill_step"] and not res["decisions"][-1:] == [False]:
            kill_after(instant_of_a_step(durations))
        if me == CFG.get("gil_rank", -1) and step == CFG.get("gil_step", -1) and "gil" not in res:
            res["gil"] = True
            hold_gil_after(instant_of_a_step(durations))
        grad = torch.full((256, 256), float(me + 1)) * (step + 1)
        ok = True
        try:
            comm.all_reduce(grad, ReduceOp.SUM, False)
            if me == CFG["fail_rank"] and step == CFG["fail_step"] and not res["decisions"][-1:] == [False]:
                ok = False  # as if this member's op had failed where the others' completed
        except torchcomms.CommError as e:
            ok = False
            res["raised"].append(type(e).__name__)
            res.setdefault("t_raised", time.time())
        decided = comm.agree(ok)
        res["decisions"].append(decided)
        if decided:
            w -= 1e-3 * grad
            if me == CFG["victim"] and step == CFG["kill_step"]:  # this step was shorter than the draw
                die(at_step_end=True)
            step += 1
            durations.append(time.monotonic() - t0)
        else:
            comm = comm.shrink()
            res["shrinks"] += 1
            res["t_recovered"] = time.time()
    res["step"] = step
    res["members"] = comm.get_global_ranks()
    res["params_sha"] = hashlib.sha256(w.numpy().tobytes()).hexdigest()
    res["t_end"] = time.time()
    write(f"result{me}.json", res)
    comm.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
