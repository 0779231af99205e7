"""Code that runs inside rank processes for the recovery tests."""
from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import torchcomms
from torchcomms import ReduceOp

from tests.helpers.exit_timing import ExitTimer


def _reconfigurable_comm(name: str, world: int, prefix: str) -> tuple[torchcomms.TorchComm, Any, list[str]]:
    """A reconfigurable gloo communicator, a store for the test's own keys and every rank's init
    handle. The keys go through the communicator's own rendezvous store (under ``prefix``): a
    second store would need a port nobody reserved, and its waits must end (60 s) well before
    the runner's limit, so that a rank that failed shows up as errors, not as a hang."""
    rendezvous = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                               int(os.environ["RANK"]) == 0, timeout=timedelta(seconds=60),
                               wait_for_workers=False)
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name, enable_reconfigure=True,
                               timeout=timedelta(seconds=30), store=rendezvous)
    store = dist.PrefixStore(prefix, rendezvous)
    store.set(f"h{comm.get_rank()}", comm.get_init_handle())
    return comm, store, [store.get(f"h{r}").decode() for r in range(world)]


def _all_arrive(store: Any, key: str, me: int, world: int) -> None:
    """A barrier through the test's store: wait until every rank has reached ``key``."""
    store.set(f"{key}-{me}", b"1")
    store.wait([f"{key}-{r}" for r in range(world)])


def _leave_together(store: Any, comm: torchcomms.TorchComm, me: int, world: int) -> None:
    """Finalize together, the store's host (rank 0) leaving last: a rank still waiting on the
    store when the host's process ends sees 'Connection reset by peer' (seen once in a suite)."""
    _all_arrive(store, "done", me, world)
    comm.finalize()
    if me == 0:
        store.wait([f"left-{r}" for r in range(1, world)])
    else:
        store.set(f"left-{me}", b"1")


def reconfigure_flow() -> dict[str, Any]:
    """Handles exchanged through a store; re-form as [2, 0] (rank 1 left out), revoke, re-form
    with everyone in reversed order."""
    comm, store, handles = _reconfigurable_comm("reconf", 3, "test/reconfigure_flow")
    me = comm.get_rank()
    out: dict[str, Any] = {}
    if me != 1:
        work = comm.reconfigure("cfg-a", [handles[2], handles[0]])
        out["work_ok"] = work.wait() is True
        out["a_rank"], out["a_size"] = comm.get_rank(), comm.get_size()
        t = torch.tensor([float(me)])
        comm.all_reduce(t, ReduceOp.SUM, False)
        out["a_sum"] = t.item()
        comm.abort()  # reconfigurable mode: a graceful revoke
        out["revoked"] = comm.is_aborted()
        try:
            comm.barrier(False)
            out["after_revoke"] = None
        except torchcomms.CommAbortedError:
            out["after_revoke"] = "CommAbortedError"
    else:
        try:
            comm.reconfigure("cfg-a", [handles[2], handles[0]])
        except torchcomms.CommValueError as e:
            out["excluded_error"] = str(e)
    _all_arrive(store, "phase-b", me, 3)
    comm.reconfigure("cfg-b", list(reversed(handles))).wait()
    out["b_rank"], out["b_size"] = comm.get_rank(), comm.get_size()
    t = torch.tensor([float(me + 1)])
    comm.all_reduce(t, ReduceOp.SUM, False)
    out["b_sum"] = t.item()
    _leave_together(store, comm, me, 3)
    return out


def reconfigure_ending_after_its_timeout() -> dict[str, Any]:
    """A reconfigure whose engine is ready only after the reconfigure timed out (the engine
    build is held until the caller has seen the timeout), then a retry."""
    import threading

    from torchcomms.backends.gloo import GlooBackend

    comm, store, handles = _reconfigurable_comm("late", 2, "test/late")
    me = comm.get_rank()
    out: dict[str, Any] = {}
    real_split, release = GlooBackend.split, threading.Event()

    def held_split(self: GlooBackend, ctx: Any) -> GlooBackend:
        child = real_split(self, ctx)  # the real engine, built over both ranks
        release.wait(60)  # ...handed back only after the reconfigure's deadline
        return child

    GlooBackend.split = held_split  # type: ignore[method-assign]
    try:
        work = comm.reconfigure("late", handles, timeout=timedelta(seconds=1))
        try:
            work.wait()
            out["wait"] = "ok"
        except torchcomms.CommTimeoutError:
            out["wait"] = "CommTimeoutError"
    finally:
        GlooBackend.split = real_split  # type: ignore[method-assign]
        release.set()
    for t in threading.enumerate():
        if t.name == "torchcomms-reconfigure-late":
            t.join(30)  # the build has handed its engine back
    out["broken_after"] = comm.is_broken()
    try:
        comm.all_reduce(torch.ones(1), ReduceOp.SUM, False, timeout=timedelta(seconds=10))
        out["op_after"] = "ran"
    except torchcomms.CommError as e:
        out["op_after"] = type(e).__name__
    _all_arrive(store, "retry", me, 2)
    comm.reconfigure("retry", handles).wait()
    t = torch.tensor([float(me + 1)])
    comm.all_reduce(t, ReduceOp.SUM, False)
    out["retry_sum"] = t.item()
    _leave_together(store, comm, me, 2)
    return out


def until_control_plane_lost() -> dict[str, Any]:
    """all_reduce in a loop until the communicator breaks; report how."""
    import time

    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "cp", timeout=timedelta(seconds=60))
    me = comm.get_rank()
    open(os.path.join(os.environ["TC_READY_DIR"], f"ready{me}"), "w").close()
    t = torch.ones(16)
    t_lost = None
    try:
        while True:
            comm.all_reduce(t, ReduceOp.SUM, False)
            time.sleep(0.02)
    except torchcomms.CommError as e:
        t_lost = time.time()
        return {"raised": type(e).__name__, "message": str(e), "t": t_lost}


def stuck_in_all_reduce() -> dict[str, Any]:
    """Rank 1 waits in an all_reduce that rank 0 never joins (rank 0 idles until killed);
    report how the op ends on rank 1."""
    import time

    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "stuck", timeout=timedelta(seconds=60))
    me = comm.get_rank()
    comm.barrier(False)  # the engine's connections are up before anyone is killed
    open(os.path.join(os.environ["TC_READY_DIR"], f"ready{me}"), "w").close()
    if me == 0:
        time.sleep(600)
    try:
        comm.all_reduce(torch.ones(16), ReduceOp.SUM, False)
    except torchcomms.CommError as e:
        return {"raised": type(e).__name__, "message": str(e), "t": time.time()}
    return {"raised": None, "message": "", "t": time.time()}


def _outcome_of(e: Exception) -> dict[str, Any]:
    """What a test needs to know of an op's error: its type, whether it is typed, its context."""
    return {"raised": type(e).__name__, "is_comm_error": isinstance(e, torchcomms.CommError),
            "op": getattr(e, "op", None), "comm": getattr(e, "comm", None), "message": str(e)[:600]}


def _stop_store_before_the_build_agreement(ready_dir: str, me: int, world: int, sig: int) -> None:
    """Makes this rank's shrink wait, once its engine is built, until every rank's is; then rank 0
    sends ``sig`` to the store host (``TC_STORE_HOST_PID``) and all go on to the agreement on
    whether every survivor built it."""
    import time

    from torchcomms.recovery import shrink as shrink_steps

    all_built = shrink_steps._all_built

    def when_every_rank_built(*args: Any, **kwargs: Any) -> bool:
        open(os.path.join(ready_dir, f"built{me}"), "w").close()
        while not all(os.path.exists(os.path.join(ready_dir, f"built{r}")) for r in range(world)):
            time.sleep(0.01)
        if me == 0:
            os.kill(int(os.environ["TC_STORE_HOST_PID"]), sig)
            open(os.path.join(ready_dir, "store-stopped"), "w").close()
        while not os.path.exists(os.path.join(ready_dir, "store-stopped")):
            time.sleep(0.01)
        return all_built(*args, **kwargs)

    shrink_steps._all_built = when_every_rank_built  # type: ignore[assignment]


def op_with_store_host_stopped(op: str, store_kind: str, timeout_s: float) -> dict[str, Any]:
    """Every rank forms a gloo communicator whose store is hosted outside the ranks, by the test
    (a TCPStore server, or the control plane), runs one all_reduce, reports ready and waits until
    the test has stopped (SIGSTOP) or killed that host. Then it runs ``op`` with ``timeout_s``
    and reports how and when that ended: ``shrink``, ``split``, ``reconfigure``, ``new_comm``
    (a second communicator over the same store), ``checked_op`` (the first collective of a
    communicator made with the collective check on: its side engine rendezvous then),
    ``finalize``, ``abort`` or ``exit`` (nothing: what is timed is the interpreter's exit);
    ``shrink_store_stops_after_build``: a shrink whose store host rank 0 stops (SIGSTOP) once
    every survivor has built the new engine, before they agree that all did."""
    import signal
    import time

    ready_dir = os.environ["TC_READY_DIR"]
    world = int(os.environ["WORLD_SIZE"])
    # registered before the library registers any exit hook of its own: it times all of them
    exit_timer = ExitTimer(os.path.join(ready_dir, f"exit{os.environ['RANK']}.json"))
    store = None  # "control": the control plane the launcher would advertise
    if store_kind == "tcp":
        store = dist.TCPStore("127.0.0.1", int(os.environ["TC_STORE_PORT"]), world, False,
                              timeout=timedelta(seconds=120), wait_for_workers=False)
    hints = {"torchcomms.check_collectives": "1"} if op == "checked_op" else None
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "stalled-store", timeout=timedelta(seconds=120),
                               store=store, enable_reconfigure=op == "reconfigure", hints=hints)
    me = comm.get_rank()
    if op != "checked_op":  # (its first collective must come after the stop)
        comm.all_reduce(torch.ones(4), ReduceOp.SUM, False)
    with open(os.path.join(ready_dir, f"handle{me}.tmp"), "w") as f:
        f.write(comm.get_init_handle() if op == "reconfigure" else "")
    os.replace(os.path.join(ready_dir, f"handle{me}.tmp"), os.path.join(ready_dir, f"ready{me}"))
    while not os.path.exists(os.path.join(ready_dir, "go")):
        time.sleep(0.01)
    timeout = timedelta(seconds=timeout_s)
    t0 = time.monotonic()
    try:
        if op == "shrink":
            comm.shrink(timeout=timeout)
        elif op == "shrink_store_stops_after_build":
            _stop_store_before_the_build_agreement(ready_dir, me, world, signal.SIGSTOP)
            comm.shrink(timeout=timeout)
        elif op == "split":
            comm.split(list(range(world)), "child", timeout=timeout)
        elif op == "reconfigure":
            handles = []
            for r in range(world):
                with open(os.path.join(ready_dir, f"ready{r}")) as f:
                    handles.append(f.read())
            comm.reconfigure("after-stop", handles, timeout=timeout).wait()
        elif op == "new_comm":
            torchcomms.new_comm("gloo", torch.device("cpu"), "second", timeout=timeout, store=store)
        elif op == "checked_op":
            comm.all_reduce(torch.ones(4), ReduceOp.SUM, False, timeout=timeout)
        elif op == "finalize":
            comm.finalize()
        elif op == "abort":
            comm.abort()
        elif op == "exit":
            pass  # the rank then leaves through the interpreter's exit (TC_RANK_EXIT_NORMALLY)
        else:
            raise ValueError(f"unknown op {op!r}")
        out: dict[str, Any] = {"raised": None}
    except Exception as e:  # noqa: BLE001 - report whatever it was
        out = _outcome_of(e)
    out["elapsed"] = time.monotonic() - t0
    exit_timer.start()
    return out


def new_comm_while_store_rank_stopped(timeout_s: float) -> dict[str, Any] | None:
    """The bootstrap's own TCPStore: rank 0 hosts it at MASTER_ADDR:MASTER_PORT (as ``new_comm``
    would), reports ready and waits to be stopped by the test. The other ranks, once the test
    has stopped rank 0, call ``new_comm`` (no store given: they connect to rank 0's) with
    ``timeout_s`` and report how and when that ended."""
    import time

    from torchcomms.setup import bootstrap

    ready_dir = os.environ["TC_READY_DIR"]
    rank, size, _ = bootstrap.discover_rank_size()
    if rank == 0:
        bootstrap.resolve_store(None, rank, size, timedelta(seconds=120))
    open(os.path.join(ready_dir, f"ready{rank}"), "w").close()
    if rank == 0:
        time.sleep(600)  # stopped, then killed, by the test
        return None
    while not os.path.exists(os.path.join(ready_dir, "go")):
        time.sleep(0.01)
    t0 = time.monotonic()
    try:
        torchcomms.new_comm("gloo", torch.device("cpu"), "late", timeout=timedelta(seconds=timeout_s))
        out: dict[str, Any] = {"raised": None}
    except Exception as e:  # noqa: BLE001 - report whatever it was
        out = _outcome_of(e)
    out["elapsed"] = time.monotonic() - t0
    return out


def monitor_start_with_control_plane_stopped(timeout_s: float) -> dict[str, Any]:
    """A communicator over the control plane whose engine needs no rendezvous (``fake``, pinned
    to a world of 2), created once the test has stopped the control plane's host: all that
    ``new_comm`` still asks of the store is the failure monitor's start (the event bus's
    position, the first heartbeat). Reports how and when ``new_comm`` ended."""
    import time

    from torchcomms.control.store import ControlStore

    ready_dir = os.environ["TC_READY_DIR"]
    store = ControlStore.from_env()  # the store's own (default) timeout: 300 s
    assert store is not None
    store.set("warm", b"1")  # the connection is up before the host is stopped
    open(os.path.join(ready_dir, "ready0"), "w").close()
    while not os.path.exists(os.path.join(ready_dir, "go")):
        time.sleep(0.01)
    t0 = time.monotonic()
    try:
        torchcomms.new_comm("fake", torch.device("cpu"), "monitored", timeout=timedelta(seconds=timeout_s),
                            store=store, hints={"rank": "0", "size": "2"})
        out: dict[str, Any] = {"raised": None}
    except Exception as e:  # noqa: BLE001 - report whatever it was
        out = _outcome_of(e)
    out["elapsed"] = time.monotonic() - t0
    return out
