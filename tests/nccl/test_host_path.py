"""The nccl backend's host path on CPU (no GPU needed): synchronous ops reach the engine with
``asyncOp=False`` (c10d's current-stream path) and are still stream-waited as c10d does; the
c10d options are made once; the completion poller is not woken per op and is urged by host
waiters; the engine's per-op device time reaches the op record and the flight recorder."""
from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

import torchcomms
from tests.helpers.torch_versions import TORCH_2_13
from torchcomms import ReduceOp
from torchcomms.backends import nccl, nccl_completion
from torchcomms.backends.base import BackendCapabilities, BackendContext, EngineHandle, TorchCommBackend
from torchcomms.backends.nccl_completion import CompletionPoller, StreamOrderedHandle


class Work:
    """A c10d work stand-in: completed when the test says so; counts stream waits."""

    def __init__(self, duration_ms: float | None = None, done: bool = False) -> None:
        self.done = threading.Event()
        if done:
            self.done.set()
        self.stream_waits = 0
        self.duration_ms = duration_ms

    def is_completed(self) -> bool:
        return self.done.is_set()

    def wait(self) -> bool:
        self.stream_waits += 1
        return True

    def _get_duration(self) -> float:
        if self.duration_ms is None:
            raise RuntimeError("getDuration only works if timing was enabled")
        return self.duration_ms


class Engine:
    """The ProcessGroupNCCL calls the backend makes, recorded with their options."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def _record(self, name: str, opts: Any) -> Work:
        self.calls.append((name, opts))
        return Work(done=True)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Work:
        return self._record("allreduce", opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Work:
        return self._record("broadcast", opts)

    def _allgather_base(self, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> Work:
        return self._record("_allgather_base", opts)

    def _reduce_scatter_base(self, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> Work:
        self.sent = inp
        return self._record("_reduce_scatter_base", opts)

    def alltoall_base(self, out: torch.Tensor, inp: torch.Tensor, o: list[int], i: list[int], opts: Any) -> Work:
        return self._record("alltoall_base", opts)

    def get_error(self) -> Any:
        return type("E", (), {"name": "SUCCESS"})()

    def shutdown(self) -> None:
        pass

    abort = shutdown


class RecordingNccl(nccl.NcclBackend):
    """``NcclBackend`` over :class:`Engine`, on CPU tensors."""

    backend_name = "nccl-recording"
    capabilities = BackendCapabilities(devices=("cpu",), abort=True, current_stream_sync=True)

    @classmethod
    def is_available(cls) -> bool:
        return True

    @classmethod
    def needs_store(cls, size: int) -> bool:
        return False

    def init(self, split_from: Any = None, exclude: Any = None) -> None:
        self._device = self.ctx.device
        self._pg = Engine()
        self._aborted = False
        self._barrier_buf = None
        self._opts = {}
        self._timed = False
        self._poller = CompletionPoller(self.ctx.name, self._engine_error)


def backend() -> RecordingNccl:
    b = RecordingNccl(BackendContext("rec", 0, 1, torch.device("cpu"), None, "rec", timedelta(seconds=5)))
    b.init()
    return b


needs_async_op = pytest.mark.skipif(not nccl._HAS_ASYNC_OP, reason="this torch's c10d options have no asyncOp")


@needs_async_op
def test_sync_ops_ask_c10d_for_the_current_stream_and_reuse_their_options() -> None:
    b = backend()
    t = torch.ones(4)
    b.all_reduce(t, ReduceOp.SUM, async_op=False)
    b.all_reduce(t, ReduceOp.SUM, async_op=False)
    b.all_reduce(t, ReduceOp.SUM, async_op=True)
    b.all_reduce(t, ReduceOp.MAX, async_op=False)
    (_, a), (_, a2), (_, c), (_, m) = b._pg.calls
    assert a.asyncOp is False and c.asyncOp is True and m.asyncOp is False
    assert a is a2 and a is not c and a is not m  # made once per (op, reduction, async_op)
    assert a.reduceOp == dist.ReduceOp.SUM and m.reduceOp == dist.ReduceOp.MAX
    b._pg.calls.clear()
    b.broadcast(t, 0, async_op=False)
    b.all_gather_single(torch.empty(4), t, async_op=False)
    b.reduce_scatter_single(torch.empty(4), t, ReduceOp.SUM, async_op=True)
    b.all_to_all_single(torch.empty(4), t, async_op=False)
    b.barrier(async_op=False)
    got = [(name, opts.asyncOp) for name, opts in b._pg.calls]
    assert got == [("broadcast", False), ("_allgather_base", False), ("_reduce_scatter_base", True),
                   ("alltoall_base", False), ("allreduce", False)]
    assert b._pg.calls[0][1].rootRank == 0
    b._poller.stop()


def test_premul_sum_is_a_scale_then_a_sum() -> None:
    b = backend()
    t = torch.full((4,), 2.0)
    b.all_reduce(t, ReduceOp.PREMUL_SUM(0.5), async_op=False)
    assert torch.equal(t, torch.ones(4))
    assert b._pg.calls[0][1].reduceOp == dist.ReduceOp.SUM
    b._poller.stop()


def test_premul_sum_with_a_one_element_tensor_factor_keeps_the_dtype_and_scales_a_0_dim_tensor() -> None:
    """The factor ``torch.tensor([0.5])`` (float32, shape (1,)) promoted a bfloat16 input's scaled
    copy to float32, and could not scale a 0-dim tensor in place (the engines share one helper)."""
    b = backend()
    half = ReduceOp.PREMUL_SUM(torch.tensor([0.5]))
    b.reduce_scatter_single(torch.empty(4, dtype=torch.bfloat16), torch.full((4,), 2.0, dtype=torch.bfloat16), half,
                            async_op=False)
    assert b._pg.sent.dtype == torch.bfloat16 and torch.equal(b._pg.sent, torch.ones(4, dtype=torch.bfloat16))
    t = torch.tensor(2.0)
    b.all_reduce(t, half, async_op=False)
    assert torch.equal(t, torch.tensor(1.0))
    b._poller.stop()


class FlagBackend(TorchCommBackend):
    """Stream-ordered all-reduce that records the ``async_op`` dispatch gave it."""

    backend_name = "flag-test"
    capabilities = BackendCapabilities(devices=("cpu",), current_stream_sync=True)
    seen: list[bool] = []
    works: list[Work] = []
    duration_ms: float | None = None

    def init(self) -> None:
        self.poller = CompletionPoller(self.ctx.name, lambda: None)

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True) -> EngineHandle:
        type(self).seen.append(async_op)
        w = Work(type(self).duration_ms)
        type(self).works.append(w)
        return StreamOrderedHandle(w, self.poller, timed=type(self).duration_ms is not None)

    def abort(self) -> None:
        self.poller.stop()

    finalize = abort


@pytest.fixture
def flag_comm():  # noqa: ANN201
    torchcomms.register_backend("flag-test", FlagBackend)
    FlagBackend.seen, FlagBackend.works, FlagBackend.duration_ms = [], [], None
    c = torchcomms.new_comm("flag-test", torch.device("cpu"), name=f"flag-{time.monotonic_ns()}",
                            timeout=timedelta(seconds=30), hints={"rank": "0", "size": "1"})
    yield c
    c.abort()


def test_dispatch_tells_the_engine_whether_an_op_is_synchronous(flag_comm) -> None:  # noqa: ANN001
    flag_comm.all_reduce(torch.ones(4), ReduceOp.SUM, False)
    flag_comm.all_reduce(torch.ones(4), ReduceOp.SUM, True)
    assert FlagBackend.seen == [False, True]
    sync, asynchronous = FlagBackend.works
    assert sync.stream_waits == 1 and asynchronous.stream_waits == 0  # a sync op is stream-waited at once


def test_device_duration_reaches_the_record_and_the_flight_recorder(flag_comm) -> None:  # noqa: ANN001
    from torchcomms.hooks import FlightRecorderHook

    fr = FlightRecorderHook(max_entries=16, isolated=True)
    fr.register_with_comm(flag_comm)
    FlagBackend.duration_ms = 1.25
    timed = flag_comm.all_reduce(torch.ones(4), ReduceOp.SUM, True)
    FlagBackend.duration_ms = None
    untimed = flag_comm.all_reduce(torch.ones(4), ReduceOp.SUM, True)
    for w in FlagBackend.works:
        w.done.set()
    timed.wait_blocking(timeout=10)
    untimed.wait_blocking(timeout=10)
    assert timed.record.device_duration_ms == 1.25 and untimed.record.device_duration_ms is None
    dump = json.loads(fr.dump_json())
    by_seq = {e["collective_seq_id"]: e for e in dump["entries"]}
    assert by_seq[timed.record.seq]["duration_ms"] == 1.25
    assert by_seq[untimed.record.seq]["duration_ms"] != 1.25  # the host-observed time instead
    ext = dump["torchcomms"]["ops"]
    assert sorted(op["device_duration_ms"] is None for op in ext.values()) == [False, True]


def test_host_waiters_urge_the_poller(flag_comm, monkeypatch) -> None:  # noqa: ANN001
    urged = []
    monkeypatch.setattr(StreamOrderedHandle, "urge", lambda self: urged.append(1))
    w = flag_comm.all_reduce(torch.ones(4), ReduceOp.SUM, True)
    assert w.is_completed() is False and len(urged) == 1  # a poll from the host asks for promptness
    threading.Timer(0.2, FlagBackend.works[0].done.set).start()
    assert w.wait_blocking(timeout=20) is True and len(urged) == 2
    assert w.is_completed() and len(urged) == 2  # ended: nothing to urge


class CountingEvent(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


def test_an_active_poller_is_not_woken_per_op() -> None:
    """Ops issued one by one, each completed before the next: the poller retires each while it
    keeps looking lazily, so ``add`` never wakes it (a wake takes the GIL from the issuing thread),
    except after a gap longer than ``QUIET_LOOK_S`` (then it sleeps until woken)."""
    poller = CompletionPoller("quiet", lambda: None)
    wake = CountingEvent()
    poller._wake = wake
    seen: list[object] = []
    long_gaps = 0
    last = time.monotonic()
    for _ in range(30):
        poller.add(Work(done=True), seen.append)
        time.sleep(0.002)  # long enough for the poller to retire the op and find nothing pending
        now = time.monotonic()
        long_gaps += now - last >= nccl_completion.QUIET_LOOK_S
        last = now
    poller.urge()  # retire what is left promptly
    deadline = time.monotonic() + 30
    while len(seen) < 30 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(seen) == 30
    assert wake.sets - 1 <= long_gaps  # the one set() is urge()'s
    poller.stop()


def test_timing_follows_tracing_unless_hinted(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv("TORCHCOMM_TRACING_DISABLE", raising=False)
    monkeypatch.delenv("TORCHCOMM_FR_MAX_ENTRIES", raising=False)
    assert nccl._timing_wanted({}) is True
    assert nccl._timing_wanted({nccl.TIMING_HINT: "0"}) is False
    monkeypatch.setenv("TORCHCOMM_TRACING_DISABLE", "1")
    assert nccl._timing_wanted({}) is False
    assert nccl._timing_wanted({nccl.TIMING_HINT: "1"}) is True
    monkeypatch.setenv("TORCHCOMM_TRACING_DISABLE", "0")
    monkeypatch.setenv("TORCHCOMM_FR_MAX_ENTRIES", "0")
    assert nccl._timing_wanted({}) is False


class GlooEngineNccl(RecordingNccl):
    """``NcclBackend``'s op methods over c10d's gloo engine (the same ``Backend`` bindings as
    ``ProcessGroupNCCL``): every call must be one c10d accepts, with the options it is given."""

    backend_name = "nccl-over-gloo"

    def init(self, split_from: Any = None, exclude: Any = None) -> None:
        super().init()
        self._pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=30))


@pytest.mark.parametrize("async_op", [False, True])
def test_every_op_method_makes_a_call_c10d_accepts(async_op: bool) -> None:
    b = GlooEngineNccl(BackendContext("gl", 0, 1, torch.device("cpu"), None, "gl", timedelta(seconds=5)))
    b.init()
    a = torch.arange(8, dtype=torch.float32) + 1
    kw = {"async_op": async_op}
    outs: dict[str, Any] = {}

    def run(name: str, handle: EngineHandle, out: Any) -> None:
        handle._work.wait()
        outs[name] = out

    t = a.clone()
    run("all_reduce", b.all_reduce(t, ReduceOp.SUM, **kw), t)
    t = a.clone()
    run("premul", b.all_reduce(t, ReduceOp.PREMUL_SUM(2.0), **kw), t / 2)
    t = a.clone()
    run("reduce", b.reduce(t, 0, ReduceOp.MAX, **kw), t)
    t = a.clone()
    run("broadcast", b.broadcast(t, 0, **kw), t)
    o = [torch.empty(8)]
    run("all_gather", b.all_gather(o, a, **kw), o[0])
    o1 = torch.empty(8)
    run("all_gather_single", b.all_gather_single(o1, a, **kw), o1)
    o2 = torch.empty(8)
    run("reduce_scatter", b.reduce_scatter(o2, [a], ReduceOp.SUM, **kw), o2)
    o3 = torch.empty(8)
    run("reduce_scatter_single", b.reduce_scatter_single(o3, a, ReduceOp.SUM, **kw), o3)
    o4 = torch.empty(8)
    run("all_to_all_single", b.all_to_all_single(o4, a, **kw), o4)
    o5 = torch.empty(8)
    run("all_to_all_v_single", b.all_to_all_v_single(o5, a, [8], [8], **kw), o5)
    if TORCH_2_13:  # the list all-to-all of this test's gloo engine (torch 2.11's has none)
        o6 = [torch.empty(8)]
        run("all_to_all", b.all_to_all(o6, [a], **kw), o6[0])
    o7 = torch.empty(8)
    run("scatter", b.scatter(o7, [a], 0, **kw), o7)
    o8 = [torch.empty(8)]
    run("gather", b.gather(o8, a, 0, **kw), o8[0])
    o9 = torch.empty(8)
    run("gather_single", b.gather_single(o9, a, 0, **kw), o9)  # the base class's, over gather
    o10 = [torch.empty(8)]
    run("all_gather_v", b.all_gather_v(o10, a, **kw), o10[0])
    o11 = torch.empty(8)
    run("reduce_scatter_v", b.reduce_scatter_v(o11, [a], ReduceOp.SUM, **kw), o11)
    b.barrier(**kw)._work.wait()
    for name, out in outs.items():
        assert torch.equal(out, a), name
    b._poller.stop()


def test_stream_ordered_handle_waits_on_the_host_only_when_asked() -> None:
    """What dispatch and the collective check ask of the handle: pending, no wait inside the
    engine; ``wait_until`` ends at the deadline while the op runs, and with the op's outcome."""
    poller = CompletionPoller("h", lambda: None)
    work = Work()
    h = StreamOrderedHandle(work, poller)
    assert h.stream_ordered and not h.is_immediate and not h.succeeded_in_call and not h.can_wait_in_engine
    with pytest.raises(TimeoutError):
        h.wait_until(time.monotonic() + 0.05)
    work.done.set()
    assert StreamOrderedHandle(work, poller).wait_until(time.monotonic() + 30) is None
    h.stream_wait()
    assert work.stream_waits == 1 and h.device_duration_ms() is None
    poller.stop()
