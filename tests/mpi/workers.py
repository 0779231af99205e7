"""Code that runs inside MPI test ranks (started by ``tests.helpers.mpi_ranks``)."""
from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

import torchcomms
from torchcomms import ReduceOp


def _ready(rank: int) -> None:
    (Path(os.environ["TC_GROUP_DIR"]) / f"ready{rank}").touch()


def _go() -> None:
    go = Path(os.environ["TC_GROUP_DIR"]) / "go"
    while not go.exists():
        time.sleep(0.005)


def ready_then_return() -> int:
    """Marks this rank ready and returns its MPI rank (the job launcher's own tests)."""
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    _ready(rank)
    return rank


def ops_until_failure(timeout_s: float, limit_s: float = 60.0, numel: int = 4096) -> dict[str, Any]:
    """All ranks loop all_reduce of ``numel`` floats until one fails (the test kills a rank at a
    random instant); the survivors report the error, shrink, and check an all_reduce on the survivors."""
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "chaos", timeout=timedelta(seconds=timeout_s),
                               abort_process_on_timeout_or_error=False)
    r, n = comm.get_rank(), comm.get_size()
    t = torch.ones(numel)
    comm.all_reduce(t, ReduceOp.SUM, False)
    _ready(r)
    out: dict[str, Any] = {"rank": r, "size": n}
    start = time.monotonic()
    ops = 0
    failed_at = None
    try:
        while time.monotonic() - start < limit_s:
            t.fill_(1.0)
            comm.all_reduce(t, ReduceOp.SUM, False)
            ops += 1
            if t[0].item() != n:
                out["wrong_sum"] = t[0].item()
                break
        out["raised"] = None
    except torchcomms.CommError as e:
        failed_at = time.monotonic()
        out.update(raised=type(e).__name__, message=str(e), failed_ranks=getattr(e, "failed_ranks", None))
    out["ops"] = ops
    if failed_at is None:
        return out
    # times are time.monotonic(): one clock for every process of this host (the killer's too)
    new = comm.shrink()
    shrunk_at = time.monotonic()
    out.update(new_rank=new.get_rank(), new_size=new.get_size(), global_ranks=new.get_global_ranks())
    x = torch.full((8,), float(r))
    new.all_reduce(x, ReduceOp.SUM, False)
    out.update(t_detect=failed_at, t_shrunk=shrunk_at, t_first_op=time.monotonic(), sum=x[0].item())
    old_after = None
    try:
        comm.all_reduce(torch.ones(2), ReduceOp.SUM, False)
    except torchcomms.CommError as e:
        old_after = type(e).__name__
    out["old_after"] = old_after
    new.finalize()
    return out


def stalled_peer(timeout_s: float, victim: int, hints: dict[str, str] | None = None) -> dict[str, Any]:
    """Everyone runs a warm-up all_reduce; the test stops ``victim``; the others' next
    all_reduce must end at its deadline with CommTimeoutError, and later ops fail at once."""
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "stall", timeout=timedelta(seconds=timeout_s),
                               abort_process_on_timeout_or_error=False, hints=hints)
    r = comm.get_rank()
    t = torch.ones(1024)
    comm.all_reduce(t, ReduceOp.SUM, False)
    _ready(r)
    if r == victim:
        time.sleep(3600)
    _go()
    out: dict[str, Any] = {}
    for async_op in (False,):
        t0 = time.monotonic()
        try:
            comm.all_reduce(t, ReduceOp.SUM, async_op)
            out["raised"] = None
        except torchcomms.CommError as e:
            out.update(raised=type(e).__name__, message=str(e), op=e.op, seq=e.seq)
        out["elapsed"] = time.monotonic() - t0
    t1 = time.monotonic()
    try:
        comm.barrier(False)
        out["after"] = None
    except torchcomms.CommError as e:
        out["after"] = type(e).__name__
    out["after_elapsed"] = time.monotonic() - t1
    comm.abort()
    return out


def shrink_without_ulfm() -> dict[str, Any]:
    """``shrink`` on a job launched without ULFM: a typed error that says what is missing."""
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "noft", abort_process_on_timeout_or_error=False)
    t = torch.ones(4)
    comm.all_reduce(t, ReduceOp.SUM, False)
    caps = comm._backend.capabilities
    try:
        comm.shrink(timeout=timedelta(seconds=10))
        return {"raised": None, "shrink_capability": caps.shrink}
    except torchcomms.CommError as e:
        return {"raised": type(e).__name__, "message": str(e), "shrink_capability": caps.shrink}


def wrong_world() -> dict[str, Any]:
    """A communicator whose job rank/size (from TORCHCOMM_*) is not the MPI world's."""
    try:
        torchcomms.new_comm("mpi", torch.device("cpu"), "wrong")
        return {"raised": None}
    except (torchcomms.CommError, ValueError) as e:
        return {"raised": type(e).__name__, "message": str(e)}


def dtype_reductions(paths: dict[str, dict[str, str]]) -> dict[str, Any]:
    """all_reduce of every dtype this backend declares, with every reduce op the dtype allows,
    against a reference computed locally from every rank's input: once per entry of ``paths``
    (a name and the hints of a communicator of its own), in one job."""
    out = {}
    for name, hints in paths.items():
        comm = torchcomms.new_comm("mpi", torch.device("cpu"), f"dtypes-{name}", hints=hints)
        out[name] = _dtype_reductions(comm)
        comm.finalize()
    return out


def _dtype_reductions(comm: torchcomms.TorchComm) -> dict[str, Any]:
    r, n = comm.get_rank(), comm.get_size()
    failures: list[str] = []
    checks = 0
    for dt in sorted(comm._backend.capabilities.dtypes, key=str):
        ops: list[tuple[str, ReduceOp]] = [("SUM", ReduceOp.SUM), ("MAX", ReduceOp.MAX), ("MIN", ReduceOp.MIN),
                                           ("PRODUCT", ReduceOp.PRODUCT)]
        if dt.is_complex:
            ops = [("SUM", ReduceOp.SUM), ("PRODUCT", ReduceOp.PRODUCT)]
        if dt.is_floating_point or dt.is_complex:
            ops += [("AVG", ReduceOp.AVG), ("PREMUL_SUM", ReduceOp.PREMUL_SUM(0.5))]
        elif dt is not torch.bool:
            ops += [("BAND", ReduceOp.BAND), ("BOR", ReduceOp.BOR), ("BXOR", ReduceOp.BXOR)]
        for name, op in ops:
            xs = [((torch.arange(7) * (q + 2) + q) % 3 + (0 if dt is torch.bool else 1)).to(dt) for q in range(n)]
            t = xs[r].clone()
            comm.all_reduce(t, op, False)
            want = _reference(name, xs, dt)
            checks += 1
            ok = torch.allclose(t.to(torch.complex128), want.to(torch.complex128), rtol=1e-2, atol=1e-2)
            if not ok:
                failures.append(f"{dt} {name}: got {t.tolist()} want {want.tolist()}")
    return {"failures": failures, "checks": checks}


def _reference(name: str, xs: list[torch.Tensor], dt: torch.dtype) -> torch.Tensor:
    if dt is torch.bool:
        st = torch.stack(xs)
        return st.any(0) if name in ("SUM", "MAX") else st.all(0)
    if name in ("BAND", "BOR", "BXOR"):
        fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[name]
        out = xs[0].clone()
        for x in xs[1:]:
            out = fn(out, x)
        return out
    wide = torch.complex128 if dt.is_complex else torch.float64
    st = torch.stack([x.to(wide) for x in xs])
    return {"SUM": lambda: st.sum(0), "PRODUCT": lambda: st.prod(0), "MIN": lambda: st.real.min(0).values,
            "MAX": lambda: st.real.max(0).values, "AVG": lambda: st.mean(0),
            "PREMUL_SUM": lambda: (st * 0.5).sum(0)}[name]()


def exit_with_a_stopped_peer(timeout_s: float) -> dict[str, Any]:
    """Rank 1 stops itself; rank 0's op times out, it aborts the communicator and exits
    normally (the test checks how the job ends)."""
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "exit-stuck", timeout=timedelta(seconds=timeout_s),
                               abort_process_on_timeout_or_error=False)
    r = comm.get_rank()
    comm.all_reduce(torch.ones(4), ReduceOp.SUM, False)
    if r == 1:
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)
    try:
        comm.all_reduce(torch.ones(4), ReduceOp.SUM, False)
        raised = None
    except torchcomms.CommError as e:
        raised = type(e).__name__
    comm.abort()
    return {"raised": raised}


def agree_rounds(no_voter: int, victim: int | None = None) -> dict[str, Any]:
    """``TorchComm.agree`` on MPI: a healthy round where all vote yes, one where ``no_voter``
    votes no; then (with ``victim``) that rank dies, the survivors' next op fails, and they agree
    on the broken communicator: all yes, then ``no_voter`` no."""
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "agree", timeout=timedelta(seconds=30),
                               abort_process_on_timeout_or_error=False)
    r = comm.get_rank()
    out: dict[str, Any] = {"rank": r, "engine_agree": comm._backend.capabilities.agree}
    out["all_yes"] = comm.agree(True)
    out["one_no"] = comm.agree(r != no_voter)
    if victim is None:
        comm.finalize()
        return out
    if r == victim:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)  # a crash (ULFM is told of a signalled process at once)
    try:
        while True:
            comm.all_reduce(torch.ones(16), ReduceOp.SUM, False)
    except torchcomms.CommError as e:
        out["raised"] = type(e).__name__
    t0 = time.monotonic()
    out["after_all_yes"] = comm.agree(True)
    out["after_one_no"] = comm.agree(r != no_voter)
    out["after_elapsed"] = time.monotonic() - t0
    comm.abort()
    return out


def agree_without_ulfm() -> dict[str, Any]:
    """``agree`` on an MPI job without ULFM and without a store: a typed error that says what is missing."""
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "agree-noft", abort_process_on_timeout_or_error=False)
    try:
        comm.agree(True)
        return {"raised": None}
    except torchcomms.CommError as e:
        return {"raised": type(e).__name__, "message": str(e)}
    finally:
        comm.finalize()


def collective_paths(hints: dict[str, str] | None = None, libnbc_allreduce: str | None = None) -> dict[str, Any]:
    """Which path the collectives take (the engine thread starts with the first op routed to it),
    and correct results when small and large ops of both paths follow each other, async ones
    still queued. ``libnbc_allreduce``: this rank's choice of libnbc all-reduce algorithm, set
    before MPI is initialised (``""``: none, torchcomms chooses; ``"per-rank"``: rank 0
    Rabenseifner, the others binomial)."""
    from torchcomms.backends.mpi import engine

    if libnbc_allreduce is not None:
        os.environ.pop(engine.LIBNBC_ALLREDUCE_VAR, None)
        if libnbc_allreduce == "per-rank":
            libnbc_allreduce = "3" if os.environ["OMPI_COMM_WORLD_RANK"] == "0" else "2"
        if libnbc_allreduce:
            os.environ[engine.LIBNBC_ALLREDUCE_VAR] = libnbc_allreduce
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "paths", hints=hints)
    r, n = comm.get_rank(), comm.get_size()
    backend = comm._backend
    want = float(n * (n + 1) // 2)
    small = torch.full((256,), float(r + 1))  # 1 KiB
    comm.all_reduce(small, ReduceOp.SUM, False)
    thread_after_small = backend._thread is not None
    large = torch.full((1 << 18,), float(r + 1))  # 1 MiB
    comm.all_reduce(large, ReduceOp.SUM, False)
    thread_after_large = backend._thread is not None
    sums_ok = bool((small == want).all() and (large == want).all())
    reduced = torch.full((1 << 18,), float(r + 1))
    comm.reduce(reduced, 0, ReduceOp.SUM, False)
    thread_after_large_reduce = backend._thread is not None
    sums_ok &= bool((reduced == want).all()) if r == 0 else bool((reduced == float(r + 1)).all())
    for i in range(20):  # large async ops of both paths, small ones behind them
        big = torch.full((1 << 18,), float(i + r))
        work = comm.all_reduce(big, ReduceOp.SUM, True)
        root_sum = torch.full((1 << 17,), float(i + r))
        rwork = comm.reduce(root_sum, i % n, ReduceOp.SUM, True)
        tiny = torch.full((16,), float(i * r))
        comm.all_reduce(tiny, ReduceOp.MAX, False)
        work.wait()
        rwork.wait()
        sums_ok &= bool((big == float(n * i + n * (n - 1) // 2)).all() and (tiny == float(i * (n - 1))).all())
        if r == i % n:
            sums_ok &= bool((root_sum == float(n * i + n * (n - 1) // 2)).all())
    comm.finalize()
    return {"thread_after_small": thread_after_small, "thread_after_large": thread_after_large,
            "thread_after_large_reduce": thread_after_large_reduce, "sums_ok": sums_ok,
            "libnbc_allreduce": os.environ.get(engine.LIBNBC_ALLREDUCE_VAR)}


def counts_past_int_max() -> dict[str, Any]:
    """Ops whose MPI count (a C int) would be past 2**31 - 1 elements, on uint8 tensors that are
    never written (``torch.empty`` of untouched pages costs no memory): each one's error, then an
    all_reduce that must still work on the same communicator."""
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "big-counts", timeout=timedelta(seconds=60))
    r, n = comm.get_rank(), comm.get_size()
    big = 2**31 + 8

    def outcome(call: Any) -> str:
        try:
            call()
        except Exception as e:  # noqa: BLE001 - the test reads the error's type and message
            return f"{type(e).__name__}: {e}"
        return "returned"

    t = torch.empty(big, dtype=torch.uint8)
    out = {
        "all_reduce": outcome(lambda: comm.all_reduce(t, ReduceOp.MAX, False)),
        "broadcast": outcome(lambda: comm.broadcast(t, 0, False)),
        "reduce": outcome(lambda: comm.reduce(t, 0, ReduceOp.MAX, False)),
        "all_to_all_v_single": outcome(lambda: comm.all_to_all_v_single(
            torch.empty(big, dtype=torch.uint8), t, [big if q == r else 0 for q in range(n)],
            [big if q == r else 0 for q in range(n)], False)),
        "p2p": outcome(lambda: comm.send(t, 1, False) if r == 0 else comm.recv(t, 0, False)),
    }
    x = torch.ones(4)
    comm.all_reduce(x, ReduceOp.SUM, False)
    out["sum_after"] = x.tolist()
    comm.finalize()
    return out


def killed_peer_in(kind: str) -> dict[str, Any]:
    """The last rank kills itself (SIGKILL) while the others wait in an op of ``kind`` on it:
    ``"async"`` (an all_reduce issued with async_op=True, then wait()) or ``"batch"`` (a batch of
    a send to it and a receive from it). Each survivor returns its error's type and message."""
    comm, r, n = _last_rank_dies(f"killed-{kind}", 0.5)
    try:
        if kind == "async":
            comm.all_reduce(torch.ones(8), ReduceOp.SUM, True).wait()
        else:
            batch = comm.batch_op_create()
            batch.send(torch.ones(4), n - 1)
            batch.recv(torch.empty(4), n - 1)
            batch.issue(False)
    except torchcomms.CommError as e:
        return {"raised": type(e).__name__, "message": str(e)}
    return {"raised": None}


def op_after_a_peer_aborted(numel: int, timed_out_first: bool) -> dict[str, Any]:
    """Rank 0 aborts the communicator (under ULFM: revokes it), with ``timed_out_first`` after its
    all_reduce timed out alone (the request stays pending in MPI), and tells the others through
    the job's directory; each other rank then starts an all_reduce of ``numel`` floats on it and
    returns its error's type and message."""
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "peer-aborted", timeout=timedelta(seconds=30),
                               abort_process_on_timeout_or_error=False)
    r = comm.get_rank()
    comm.all_reduce(torch.ones(numel), ReduceOp.SUM, False)
    done = Path(os.environ["TC_GROUP_DIR"]) / "aborted"
    if r == 0:
        if timed_out_first:
            try:
                comm.all_reduce(torch.ones(numel), ReduceOp.SUM, False, timeout=timedelta(seconds=1))
            except torchcomms.CommTimeoutError:
                pass
        comm.abort()
        done.touch()
        return {"raised": None}
    while not done.exists():
        time.sleep(0.005)
    time.sleep(0.2)  # the revoke reaches this process meanwhile (or during the op: the same outcome)
    try:
        comm.all_reduce(torch.ones(numel), ReduceOp.SUM, False)
    except torchcomms.CommError as e:
        return {"raised": type(e).__name__, "message": str(e)}
    return {"raised": None}


def hints_per_rank(hints: dict[str, dict[str, str]], split_hints: dict[str, dict[str, str]] | None = None) -> str:
    """A communicator made with ``hints[str(rank)]`` (then, with ``split_hints``, a split of it
    over every rank with ``split_hints[str(rank)]``) and one all_reduce on it: ``"ok"`` or the
    error's type and message."""
    r = os.environ["OMPI_COMM_WORLD_RANK"]
    try:
        comm = torchcomms.new_comm("mpi", torch.device("cpu"), "per-rank-hints", timeout=timedelta(seconds=20),
                                   hints=hints[r])
        if split_hints is not None:
            comm = comm.split(list(range(comm.get_size())), "per-rank-split", hints=split_hints[r])
        comm.all_reduce(torch.ones(16), ReduceOp.SUM, False)
    except torchcomms.CommError as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


def new_comm_with_a_late_peer() -> dict[str, Any]:
    """Rank 1 creates its second communicator only after rank 0's creation of it timed out
    (``new_comm(timeout=2 s)``); both then create a third one and all-reduce on it."""
    first = torchcomms.new_comm("mpi", torch.device("cpu"), "first", timeout=timedelta(seconds=30))
    r = first.get_rank()
    flag = Path(os.environ["TC_GROUP_DIR"]) / "rank0-gave-up"
    out: dict[str, Any] = {}
    if r == 1:
        while not flag.exists():
            time.sleep(0.005)
    try:
        torchcomms.new_comm("mpi", torch.device("cpu"), "second", timeout=timedelta(seconds=2))
        out["second"] = "ok"
    except torchcomms.CommError as e:
        out["second"] = f"{type(e).__name__}: {e}"
    if r == 0:
        flag.touch()
    try:
        third = torchcomms.new_comm("mpi", torch.device("cpu"), "third", timeout=timedelta(seconds=30))
    except torchcomms.CommError as e:
        out["third"] = f"{type(e).__name__}: {e}"
        first.finalize()
        return out
    t = torch.ones(4)
    third.all_reduce(t, ReduceOp.SUM, False)
    out["third_sum"] = t.tolist()
    third.finalize()
    first.finalize()
    return out


def new_comm_after_a_death() -> dict[str, Any]:
    """The last rank kills itself (SIGKILL) once every rank passed a barrier; the others, once
    their communicator saw the failure, create a new communicator over the MPI world."""
    import signal

    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "before-death", timeout=timedelta(seconds=30),
                               abort_process_on_timeout_or_error=False)
    r, n = comm.get_rank(), comm.get_size()
    comm.barrier(False)
    if r == n - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.barrier(False)
    except torchcomms.CommError:
        pass  # the failure is known here
    try:
        torchcomms.new_comm("mpi", torch.device("cpu"), "after-death", timeout=timedelta(seconds=30))
    except Exception as e:  # noqa: BLE001 - the test reads the error's type
        return {"raised": type(e).__name__, "message": str(e)}
    return {"raised": None}


def recover_then_exit() -> dict[str, Any]:
    """The last rank kills itself (SIGKILL) while the others are in an all_gather with it; the
    survivors shrink, check an all_reduce on the survivors and return, leaving through
    ``MPI_Finalize`` (the test asserts that the job then ends)."""
    comm, r, n = _last_rank_dies("recover-exit", 0.2)
    try:
        comm.all_gather([torch.empty(64) for _ in range(n)], torch.ones(64), False)
        raised = None
    except torchcomms.CommError as e:
        raised = type(e).__name__
    new = comm.shrink()
    t = torch.full((4,), float(r))
    new.all_reduce(t, ReduceOp.SUM, False)
    new.finalize()
    return {"raised": raised, "sum": t.tolist(), "size": new.get_size()}


def process_group_on_the_route(port: int) -> dict[str, Any]:
    """``init_process_group`` on the torchcomms route, ``"mpi"`` (c10d gives its default group
    rank -1 and size -1 for that name), then ``"cpu:mpi"`` with rank and size and a subgroup's
    all_reduce; each outcome."""
    import torch.distributed as dist
    from torch.distributed import config

    r, n = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    config.use_torchcomms = True
    out: dict[str, Any] = {}
    try:
        dist.init_process_group("mpi")
        out["mpi"] = [dist.get_rank(), dist.get_world_size()]
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - the test reads the error's type and message
        out["mpi"] = f"{type(e).__name__}: {e}"
    dist.init_process_group("cpu:mpi", rank=r, world_size=n, init_method=f"tcp://127.0.0.1:{port}")
    sub = dist.new_group([0, 1])
    t = torch.ones(2)
    dist.all_reduce(t, group=sub)
    out["cpu:mpi"] = [dist.get_rank(), dist.get_world_size(), t.tolist()]
    dist.destroy_process_group()
    return out


def buffers_released_after_ops() -> dict[str, bool]:
    """Whether each op's tensor is still alive (held by the library) once the op completed and
    the caller dropped it: receives (from rank 0, sync, async, any source), an async all_reduce
    and one on the engine thread. Each is looked for until it is gone, for at most 10 s (the progress thread drops
    its references once it is back waiting)."""
    import gc
    import weakref

    comm = torchcomms.new_comm("mpi", torch.device("cpu"), "released", timeout=timedelta(seconds=30))
    on_thread = torchcomms.new_comm("mpi", torch.device("cpu"), "released-thread", timeout=timedelta(seconds=30),
                                    hints={"mpi.collectives": "blocking"})
    r = comm.get_rank()
    alive: dict[str, bool] = {}
    cases = ("recv", "recv-async", "any-source", "any-source-async", "all_reduce-async", "all_reduce-engine-thread")
    for case in cases:
        t = torch.empty(1024)
        if case == "all_reduce-async":
            comm.all_reduce(t, ReduceOp.SUM, True).wait()
        elif case == "all_reduce-engine-thread":
            on_thread.all_reduce(t, ReduceOp.SUM, False)
        elif r == 0:
            comm.send(t, 1, False)
        elif case.startswith("recv"):
            comm.recv(t, 0, case.endswith("async")).wait()
        else:
            comm.recv_any_source(t, case.endswith("async")).wait()
        ref = weakref.ref(t)
        del t
        deadline = time.monotonic() + 10.0
        while ref() is not None and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.01)
        alive[case] = ref() is not None
    on_thread.finalize()
    comm.finalize()
    return alive


def _last_rank_dies(name: str, after_s: float) -> tuple[Any, int, int]:
    """A communicator whose last rank SIGKILLs itself ``after_s`` after a barrier (the others are
    in their next op by then; they fail the same way if not); the others get it and their rank
    and the size."""
    import signal

    comm = torchcomms.new_comm("mpi", torch.device("cpu"), name, timeout=timedelta(seconds=30),
                               abort_process_on_timeout_or_error=False)
    r, n = comm.get_rank(), comm.get_size()
    comm.barrier(False)
    if r == n - 1:
        time.sleep(after_s)
        os.kill(os.getpid(), signal.SIGKILL)
    return comm, r, n
