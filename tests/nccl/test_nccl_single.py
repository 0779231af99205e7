"""Every op of the API through the nccl backend at world size 1, stream ordering, the
watchdog's timeout on a busy GPU, abort, split and shrink (one process, one GPU)."""
from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import pytest
import torch

import torchcomms
from tests.helpers.cuda import returns_while_the_gpu_is_busy
from tests.nccl.conftest import needs_gpu, needs_gpus
from torchcomms import CommAbortedError, CommTimeoutError, ReduceOp
from torchcomms.core.work import ENDING_GRACE_S

pytestmark = [pytest.mark.gpu, needs_gpu]

_NAMES = iter(range(1_000_000))


def make(timeout_s: float = 60.0, hints: dict[str, str] | None = None, **kw):  # noqa: ANN201
    return torchcomms.new_comm("nccl", torch.device("cuda", 0), name=f"nccl-test-{next(_NAMES)}",
                               timeout=timedelta(seconds=timeout_s), hints={"rank": "0", "size": "1", **(hints or {})},
                               **kw)


@pytest.fixture
def comm():  # noqa: ANN201
    c = make()
    yield c
    c.finalize()


def x(n: int = 1024, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.arange(n, device="cuda", dtype=torch.int64) % 5 + 1).to(dtype)


def test_identity(comm) -> None:  # noqa: ANN001
    assert comm.get_backend() == "nccl"
    assert comm.get_rank() == 0 and comm.get_size() == 1
    assert comm.get_device() == torch.device("cuda", 0)
    assert "nccl 2." in comm.get_backend_version()
    assert type(comm.get_backend_impl()).__name__ == "ProcessGroupNCCL"
    assert torchcomms.is_backend_built("nccl")
    # c10d's own watchdog may never end the process: we raise instead
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    assert os.environ["TORCH_NCCL_ENABLE_MONITORING"] == "0"


class _NoWorkForSyncOps:
    """A c10d engine that returns no work for a synchronous op, as ProcessGroupNCCL may."""

    def __init__(self, pg: object) -> None:
        self._real = pg

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def allreduce(self, tensors, opts):  # noqa: ANN001, ANN201
        work = self._real.allreduce(tensors, opts)
        return work if opts.asyncOp else None


def test_a_sync_op_that_c10d_returns_no_work_for_completes_in_order() -> None:
    """c10d may return no work for a synchronous op (seen under CPU load: the op then failed
    with AttributeError on ``None.wait``); the op completes, on the current stream, and the
    ops after it see its result."""
    c = make()
    c._backend._pg = _NoWorkForSyncOps(c._backend._pg)
    t = x()
    for _ in range(3):
        work = c.all_reduce(t, ReduceOp.SUM, False)
        assert work.wait_blocking(30) and work.is_success()
    t.add_(1)
    c.all_reduce(t, ReduceOp.MAX, True).wait()
    torch.cuda.synchronize()
    assert torch.equal(t, x() + 1)
    c.finalize()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("async_op", [False, True])
def test_reductions(comm, dtype: torch.dtype, async_op: bool) -> None:  # noqa: ANN001
    ops = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
    if dtype.is_floating_point:
        ops += [ReduceOp.AVG, ReduceOp.PREMUL_SUM(0.5)]
    for op in ops:
        t = x(dtype=dtype)
        want = t * 0.5 if op.type.name == "PREMUL_SUM" else t.clone()
        w = comm.all_reduce(t, op, async_op)
        w.wait()
        assert torch.equal(t, want.to(dtype)), op
        r = x(dtype=dtype)
        comm.reduce(r, 0, op, async_op).wait()
        assert torch.equal(r, want.to(dtype)), op
        out = torch.empty_like(t)
        src = x(dtype=dtype)
        comm.reduce_scatter_single(out, src, op, async_op).wait()
        assert torch.equal(out, want.to(dtype)) and torch.equal(src, x(dtype=dtype)), op  # input untouched


def test_bitwise_ops_refused_before_the_engine(comm) -> None:  # noqa: ANN001
    with pytest.raises(torchcomms.CommTypeError):
        comm.all_reduce(x(dtype=torch.int64), ReduceOp.BAND, False)


@pytest.mark.parametrize("async_op", [False, True])
def test_every_other_op(comm, async_op: bool) -> None:  # noqa: ANN001
    a = x()
    works = []
    b = a.clone()
    works.append(comm.broadcast(b, 0, async_op))
    ag = [torch.empty_like(a)]
    works.append(comm.all_gather(ag, a, async_op))
    agv = [torch.empty_like(a)]
    works.append(comm.all_gather_v(agv, a, async_op))
    ags = torch.empty_like(a)
    works.append(comm.all_gather_single(ags, a, async_op))
    rs = torch.empty_like(a)
    works.append(comm.reduce_scatter(rs, [a], ReduceOp.SUM, async_op))
    rsv = torch.empty_like(a)
    works.append(comm.reduce_scatter_v(rsv, [a], ReduceOp.SUM, async_op))
    rss = torch.empty_like(a)
    works.append(comm.reduce_scatter_single(rss, a, ReduceOp.SUM, async_op))
    a2a = torch.empty_like(a)
    works.append(comm.all_to_all_single(a2a, a, async_op))
    a2av = torch.empty_like(a)
    works.append(comm.all_to_all_v_single(a2av, a, [a.numel()], [a.numel()], async_op))
    a2al = [torch.empty_like(a)]
    works.append(comm.all_to_all(a2al, [a], async_op))
    works.append(comm.barrier(async_op))
    sc = torch.empty_like(a)
    works.append(comm.scatter(sc, [a], 0, async_op))
    ga = [torch.empty_like(a)]
    works.append(comm.gather(ga, a, 0, async_op))
    gs = torch.empty_like(a)
    works.append(comm.gather_single(gs, a, 0, async_op))
    for w in works:
        w.wait()
    for out in (b, ag[0], agv[0], ags, rs, rsv, rss, a2a, a2av, a2al[0], sc, ga[0], gs):
        assert torch.equal(out, a)
    for w in works:
        w.wait_blocking()
        assert w.is_completed() and w.status is torchcomms.WorkStatus.COMPLETED


def test_wait_orders_the_stream_without_blocking_the_host(comm) -> None:  # noqa: ANN001
    t = torch.ones(1 << 20, device="cuda")

    def step() -> None:
        t.fill_(2.0)  # queued behind the spin on the current stream
        comm.all_reduce(t, ReduceOp.SUM, False)  # synchronous op: stream-ordered, host goes on
        t.mul_(3.0)
        w = comm.all_reduce(t, ReduceOp.SUM, True)
        w.wait()

    assert returns_while_the_gpu_is_busy(step)
    assert torch.all(t == 6.0)


def test_async_op_overlaps_with_caller_stream(comm) -> None:  # noqa: ANN001
    """An async op's input written on a side stream: the op waits for it (it waits on the
    stream current at issue) and the result is right without any host synchronization."""
    side = torch.cuda.Stream()
    t = torch.zeros(1 << 16, device="cuda")
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        t.fill_(7.0)
        w = comm.all_reduce(t, ReduceOp.SUM, True)
        w.wait()
        out = t * 1.0
    torch.cuda.synchronize()
    assert torch.all(out == 7.0)


#: GPU cycles of spinning queued before an op that must time out: at least ``SPIN_MIN_S`` at the
#: H200's highest SM clock (1.98 GHz)
SPIN_CYCLES = 8_000_000_000
SPIN_MIN_S = 4.0
#: how many times a stalled host gets to issue the op again behind a fresh spin
SPIN_TRIES = 5
#: how late past its deadline a timed-out op may raise: ``TorchWork.wait``'s contract (the thread
#: that ended the op may still be in its post-hooks, such as the flight recorder's failure dumps,
#: for up to ``ENDING_GRACE_S``) and a loaded host's scheduling
LATE_S = ENDING_GRACE_S + 0.5


def op_behind_a_busy_gpu(op_timeout_s: float, **make_kw: object) \
        -> tuple[torchcomms.TorchComm, torchcomms.TorchWork, torch.cuda.Event]:
    """A fresh communicator, an all-reduce of it issued behind ``SPIN_MIN_S`` of GPU spinning,
    and an event that completes when the spin ends. The op is issued early enough that the spin
    outlasts the op's deadline plus ``LATE_S``; a host stalled between queuing the spin and
    issuing the op (a loaded machine) gets another try with a fresh communicator."""
    t = torch.ones(16, device="cuda")  # allocated before the spin, not behind it
    torch.cuda.synchronize()
    stalls = []
    for _ in range(SPIN_TRIES):
        c = make(**make_kw)  # type: ignore[arg-type]
        queued = time.monotonic()
        torch.cuda._sleep(SPIN_CYCLES)
        spun = torch.cuda.Event()
        spun.record()
        w = c.all_reduce(t, ReduceOp.SUM, True, timeout=timedelta(seconds=op_timeout_s))
        stall = time.monotonic() - queued
        if stall + op_timeout_s + LATE_S < SPIN_MIN_S - 0.2:  # the GPU still spins when the op must have raised
            return c, w, spun
        stalls.append(round(stall, 2))
        torch.cuda.synchronize()
        c.abort()  # the op may or may not have timed out: this communicator is not used again
    pytest.fail(f"the host took {stalls} s to issue an op after queuing the GPU's spin, every try")


def test_timeout_on_a_busy_gpu_raises_and_breaks() -> None:
    """The GPU is busy past the op's deadline: the watchdog ends the op with CommTimeoutError
    at the deadline while the GPU still spins (the host is never blocked by the GPU), later ops
    fail fast, and abort tears the engine down."""
    comm, w, spun = op_behind_a_busy_gpu(0.5)
    t0 = time.monotonic()
    with pytest.raises(CommTimeoutError):
        w.wait_blocking()
    assert time.monotonic() - t0 < 0.5 + LATE_S
    assert not spun.query()  # raised while the GPU spins, not once it was done
    assert comm.is_broken()
    t = torch.ones(16, device="cuda")
    with pytest.raises(CommAbortedError):
        comm.all_reduce(t, ReduceOp.SUM, False)
    comm.abort()
    assert comm.is_aborted()
    torch.cuda.synchronize()
    fresh = make()
    u = torch.ones(16, device="cuda")
    fresh.all_reduce(u, ReduceOp.SUM, False)
    torch.cuda.synchronize()
    assert torch.all(u == 1.0)
    fresh.finalize()


def test_timeout_then_shrink_carries_on() -> None:
    import torch.distributed as dist

    # survivors agree through a store
    c, w, _ = op_behind_a_busy_gpu(0.3, timeout_s=30.0, store=dist.HashStore())
    with pytest.raises(CommTimeoutError):
        w.wait_blocking()
    new = c.shrink(timeout=timedelta(seconds=20))
    assert new.get_size() == 1 and new.get_backend() == "nccl"
    t = torch.full((8,), 3.0, device="cuda")
    new.all_reduce(t, ReduceOp.SUM, False)
    torch.cuda.synchronize()
    assert torch.all(t == 3.0)
    with pytest.raises(CommAbortedError):
        c.all_reduce(t, ReduceOp.SUM, False)
    new.finalize()


def test_abort_fails_in_flight_and_later_ops() -> None:
    """The op is queued behind a GPU spin, so it is in flight when abort() is called as long as
    the spin still runs then (an event recorded after the spin says so). On a loaded host the
    caller can be descheduled for longer than the spin (seen at a load of 165 on 16 CPUs: the op
    completed first and the test failed): such a try proves nothing and is made again with a
    spin four times longer."""
    cycles = 1_000_000_000  # ~0.5 s at H200 clocks
    for _ in range(3):
        c = make()
        torch.cuda._sleep(cycles)
        spinning = torch.cuda.Event()
        spinning.record()
        w = c.all_reduce(torch.ones(4, device="cuda"), ReduceOp.SUM, True)
        c.abort()
        if spinning.query():  # the spin ended before abort(): the op may have completed
            torch.cuda.synchronize()
            cycles *= 4
            continue
        with pytest.raises(CommAbortedError):
            w.wait_blocking()
        with pytest.raises(CommAbortedError):
            c.barrier(False)
        assert c.is_aborted()
        c.abort()  # idempotent, never raises
        torch.cuda.synchronize()
        return
    pytest.fail("the GPU spin ended before abort() in every try: the caller was descheduled for over 8 s")


def test_split_through_nccl(comm) -> None:  # noqa: ANN001
    child = comm.split([0], "nccl-split-child")
    assert child is not None and child.get_size() == 1
    assert comm.get_backend_impl().comm_split_count() >= 1  # ncclCommSplit, not a fresh init
    t = x()
    child.all_reduce(t, ReduceOp.MAX, False)
    torch.cuda.synchronize()
    assert torch.equal(t, x())
    child.finalize()


def test_flight_recorder_sees_gpu_completion(comm) -> None:  # noqa: ANN001
    from torchcomms.hooks import FlightRecorderHook

    fr = FlightRecorderHook(max_entries=64, isolated=True)
    fr.register_with_comm(comm)
    w = comm.all_reduce(x(), ReduceOp.SUM, True)
    w.wait_blocking()
    entries = json.loads(fr.dump_json())["entries"]
    mine = [e for e in entries if e["profiling_name"] == "nccl:all_reduce"]
    assert mine and mine[-1]["state"] == "completed"


def test_finalize_drains_issued_work() -> None:
    c = make()
    torch.cuda._sleep(200_000_000)
    t = torch.ones(1 << 10, device="cuda")
    for _ in range(8):
        c.all_reduce(t, ReduceOp.SUM, True)
    c.finalize()
    c.finalize()  # idempotent
    assert torch.all(t == 1.0)


@pytest.mark.parametrize("c10d_work", ["returned", "none"])
def test_flight_recorder_durations_come_from_the_gpu_events(c10d_work: str) -> None:
    """Timing on (the hint): the op's duration is its device time from its start and end events
    (c10d's, or ours where c10d returns no work for a synchronous op, as torch 2.11 did), read
    once the op completed: it leaves out the spin queued before the op on the stream, which the
    host-observed time (issue to seen completed) includes."""
    from torchcomms.hooks import FlightRecorderHook

    timed = make(hints={"nccl.timing": "1"})
    untimed = make(hints={"nccl.timing": "0"})
    if c10d_work == "none":
        timed._backend._pg = _NoWorkForSyncOps(timed._backend._pg)
        untimed._backend._pg = _NoWorkForSyncOps(untimed._backend._pg)
    fr = FlightRecorderHook(max_entries=64, isolated=True)
    fr.register_with_comm(timed)
    t = x()
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s at H200 clocks, queued before the op
    w = timed.all_reduce(t, ReduceOp.SUM, False)
    w.wait_blocking()
    rec = w.record
    host_ms = (rec.time_completed_ns - rec.time_started_ns) / 1e6
    assert rec.device_duration_ms is not None and 0 <= rec.device_duration_ms < host_ms / 2, (rec.device_duration_ms,
                                                                                              host_ms)
    entry = [e for e in json.loads(fr.dump_json())["entries"] if e["collective_seq_id"] == rec.seq][-1]
    assert entry["duration_ms"] == rec.device_duration_ms
    u = untimed.all_reduce(x(), ReduceOp.SUM, True)
    u.wait_blocking()
    assert u.record.device_duration_ms is None
    timed.finalize()
    untimed.finalize()


@pytest.mark.parametrize("side_stream", [False, True])
def test_sync_op_outputs_are_ready_for_the_callers_next_kernel(comm, side_stream: bool) -> None:  # noqa: ANN001
    """A synchronous op (on the caller's current stream, c10d's asyncOp=False) followed at once
    by a kernel reading its output on that stream: the kernel sees the op's result, also when
    the caller's stream is not the default one. The op is queued behind a spin so that a kernel
    not ordered after it would run first and read the poison."""
    n = 1 << 24
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        src = torch.full((n,), 3.0, device="cuda")
        outs = {name: torch.full((n,), -1.0, device="cuda") for name in ("ag", "rs", "a2a", "bc")}
        bc = outs["bc"]
        torch.cuda._sleep(200_000_000)
        bc.copy_(src)  # broadcast is in place: its input is the copy
        comm.all_gather_single(outs["ag"], src, False)
        comm.reduce_scatter_single(outs["rs"], src, ReduceOp.SUM, False)
        comm.all_to_all_single(outs["a2a"], src, False)
        comm.broadcast(bc, 0, False)
        seen = {name: o * 1.0 for name, o in outs.items()}
    torch.cuda.synchronize()
    for name, s in seen.items():
        assert torch.all(s == 3.0), name


@needs_gpus(2)
def test_a_comm_on_another_gpu_than_the_current_device_times_and_orders_its_sync_ops() -> None:
    """A process that drives two GPUs: a world-size-1 communicator on cuda:1 while the current
    device is cuda:0. Its synchronous ops' events go on cuda:1's current stream, not the current
    device's (an event of cuda:1 recorded on cuda:0's stream is refused by torch), the op is timed,
    and a kernel on cuda:1's stream right after the op reads its result."""
    torch.cuda.set_device(0)
    c = torchcomms.new_comm("nccl", torch.device("cuda", 1), name=f"nccl-test-{next(_NAMES)}",
                            timeout=timedelta(seconds=60), hints={"rank": "0", "size": "1", "nccl.timing": "1"})
    c._backend._pg = _NoWorkForSyncOps(c._backend._pg)
    try:
        t = torch.full((1 << 20,), 2.0, device="cuda:1")  # on cuda:1's current stream, as what follows
        with torch.cuda.device(1):
            torch.cuda._sleep(100_000_000)
        w = c.all_reduce(t, ReduceOp.SUM, False)
        seen = t * 1.0
        w.wait_blocking()
        assert torch.all(seen == 2.0)
        assert w.record.device_duration_ms is not None and w.record.device_duration_ms >= 0
        assert torch.cuda.current_device() == 0
    finally:
        c.finalize()
