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




def _issue(comm: torchcomms.TorchComm, op: str, step: int, async_op: bool) -> Any:
    """One op of ``kill_inside_op``'s loop (about 64 MiB of float32 where the op has one tensor)."""
    me, n = comm.get_rank(), comm.get_size()
    numel = 4 * NUMEL // (4 * n) * 4 * n  # whole pieces for every rank
    if op == "all_reduce":
        return comm.all_reduce(torch.ones(numel), ReduceOp.SUM, async_op)
    if op == "broadcast":
        return comm.broadcast(torch.ones(numel), step % n, async_op)
    if op == "all_gather_single":
        return comm.all_gather_single(torch.empty(numel), torch.ones(numel // n), async_op)
    if op == "reduce_scatter_single":
        return comm.reduce_scatter_single(torch.empty(numel // n), torch.ones(numel), ReduceOp.SUM, async_op)
    if op == "all_to_all_single":
        return comm.all_to_all_single(torch.empty(numel), torch.ones(numel), async_op)
    if op == "ring_p2p":  # each rank sends to the next and receives from the one before
        batch = comm.batch_op_create()
        batch.send(torch.ones(numel // 4), (me + 1) % n)
        batch.recv(torch.empty(numel // 4), (me - 1) % n)
        return batch.issue(async_op)
    raise ValueError(op)


def kill_inside_op(victim: int, op: str, op_timeout_s: float) -> dict[str, Any]:
    """Every rank runs ``op`` in a loop; ``victim`` SIGKILLs itself while one is in flight. A
    survivor reports how its op failed, then waits until every survivor's did (so no survivor's
    exit closes its connections before the others' ops ended)."""
    ready_dir = os.environ["TC_READY_DIR"]
    comm, _store, world = _job("killop")
    me = comm.get_rank()
    for step in range(2):
        _issue(comm, op, step, False)
    comm.set_timeout(timedelta(seconds=op_timeout_s))
    if me == victim:
        # killed 10 ms into the op, when the others are inside it too (it has rarely sent all
        # of its 64 MiB by then: test_without_launcher allows for the race that follows)
        _issue(comm, op, 2, True)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    out: dict[str, Any] = {"rank": me}
    try:
        for step in range(2, 100000):
            _issue(comm, op, step, False)
        out["raised"] = None
    except torchcomms.CommError as e:
        out.update(raised=type(e).__name__, message=str(e)[:300])
    _meet_survivors(ready_dir, me, world - 1, op_timeout_s * 2)
    return out


def _meet_survivors(ready_dir: str, me: int, count: int, timeout_s: float) -> None:
    """Mark this rank's op ended, then wait (at most ``timeout_s``) until ``count`` ranks did."""
    open(os.path.join(ready_dir, f"ended-{me}"), "w").close()
    until = time.monotonic() + timeout_s
    while len([n for n in os.listdir(ready_dir) if n.startswith("ended-")]) < count and time.monotonic() < until:
        time.sleep(0.05)


def _job(name: str) -> tuple[torchcomms.TorchComm, Any, int]:
    world = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore("127.0.0.1", int(os.environ["TC_STORE_PORT"]), world, False,
                          timeout=timedelta(seconds=120), wait_for_workers=False)
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name, timeout=timedelta(seconds=120), store=store)
    t = torch.ones(8)
    comm.all_reduce(t, ReduceOp.SUM, False)  # every rank is up and has published who it is
    return comm, store, world


def _note(name: str, text: str) -> None:
    ready_dir = os.environ["TC_READY_DIR"]
    with open(os.path.join(ready_dir, name + ".tmp"), "w") as f:
        f.write(text)
    os.replace(os.path.join(ready_dir, name + ".tmp"), os.path.join(ready_dir, name))


def peer_leaves(leaver: int, how: str, seen_within_s: float) -> dict[str, Any]:
    """``leaver`` leaves once every rank is up: ``finalize`` (its communicator finalized, then
    ``os._exit``), ``exit`` (no finalize, the interpreter's normal exit: run with
    TC_RANK_EXIT_NORMALLY=1) or ``kill`` (SIGKILL); it writes the wall-clock time it left to
    ``$TC_READY_DIR/left`` first. Every other rank waits until its store watch has a verdict on
    the leaver (exited cleanly, or failed) and reports it, when, and whether its communicator
    broke."""
    from torchcomms.recovery.store_watch import process_gone

    comm, store, world = _job("leaves")
    me = comm.get_rank()
    store.set(f"test/pid/{me}", str(os.getpid()).encode())
    if me == leaver:
        store.wait(["test/pid/" + str(r) for r in range(world)])
        _note("left", repr(time.time()))
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "finalize":
            comm.finalize()
        return {"rank": me, "left": how}
    pid = int(store.get(f"test/pid/{leaver}"))
    watch = comm._core.monitor  # noqa: SLF001 - the test reads the watch's verdict
    deadline = time.monotonic() + seen_within_s
    while not process_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    gone_at = time.time()
    exited: set[int] = getattr(watch, "exited", set())  # (a watch without it takes every exit for a death)
    while leaver not in exited and leaver not in watch.failed and time.monotonic() < deadline:
        time.sleep(0.01)
    out = {"rank": me, "gone": process_gone(pid), "gone_at": gone_at, "at": time.time(),
           "verdict": "exited" if leaver in exited else "failed" if leaver in watch.failed else None,
           "broken": comm.is_broken(), "failed": sorted(watch.failed)}
    # No survivor leaves before all have looked: one that leaves with os._exit without
    # finalizing is (rightly) a failure to the others.
    store.add("test/looked", 1)
    while int(store.add("test/looked", 0)) < world - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    return out


def agree_after_kill(victim: int, agree_timeout_s: float) -> dict[str, Any]:
    """``victim`` SIGKILLs itself once every rank is up (after writing the time to
    ``$TC_READY_DIR/killed``); the others call ``agree(True)`` at once and report what it
    decided and when it returned."""
    comm, store, world = _job("agree-kill")
    me = comm.get_rank()
    if me == victim:
        _note("killed", repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        decided: Any = comm.agree(True, timeout=timedelta(seconds=agree_timeout_s))
    except torchcomms.CommError as e:
        decided = f"{type(e).__name__}: {e}"
    return {"rank": me, "decided": decided, "at": time.time()}


def agree_rounds(rounds: int) -> dict[str, Any]:
    """``rounds`` agrees (rank 1 says no in every third); rank 0 counts the store's keys before
    and after (every rank has returned from the last one by then: an all_reduce follows)."""
    comm, store, world = _job("agree-rounds")
    me = comm.get_rank()
    before = store.num_keys()
    comm.all_reduce(torch.ones(1), ReduceOp.SUM, False)
    decided = [comm.agree(not (me == 1 and n % 3 == 0)) for n in range(rounds)]
    comm.all_reduce(torch.ones(1), ReduceOp.SUM, False)
    after = store.num_keys()
    comm.finalize()
    return {"rank": me, "decided": decided, "before": before, "after": after}


def shrink_unwatched(victim: int, timeout_s: float) -> dict[str, Any]:
    """No control plane and no store watch: ``victim`` exits (``os._exit``) after a first
    all_reduce, the others meet its absence in their next ones, then shrink with a
    ``timeout_s`` deadline. Rank 0 hosts the store and stays until the others are done."""
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "unwatched", timeout=timedelta(seconds=timeout_s))
    t = torch.ones(4)
    comm.all_reduce(t, ReduceOp.SUM, False)
    if comm.get_rank() == victim:
        os._exit(3)
    out: dict[str, Any] = {}
    try:
        for _ in range(1000):
            comm.all_reduce(t, ReduceOp.SUM, False)
            time.sleep(0.01)
    except torchcomms.CommError as e:
        out["raised"] = type(e).__name__
    try:
        comm.shrink()
        out["shrink"] = "ok"
    except torchcomms.CommError as e:
        out["shrink"] = f"{type(e).__name__}: {e}"
    if comm.get_rank() == 0:
        time.sleep(2.0)
    return out
