"""The stream-ordered completion path on CPU (no GPU needed): the poller, and ``TorchComm`` /
``TorchWork`` with a handle that waits by stream (``wait()`` never blocks the host; the
watchdog still ends an op at its deadline)."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch

import torchcomms
from torchcomms import CommTimeoutError, ReduceOp
from torchcomms.backends.base import BackendCapabilities, EngineHandle, TorchCommBackend
from torchcomms.backends.nccl_completion import CompletionPoller, EngineFailed, StreamOrderedHandle


class FakeWork:
    """A c10d work stand-in: completed when the test says so; ``wait`` counts stream waits."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.stream_waits = 0

    def is_completed(self) -> bool:
        return self.done.is_set()

    def wait(self) -> bool:
        self.stream_waits += 1
        return True


def until(cond, limit: float = 5.0) -> bool:  # noqa: ANN001
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.001)
    return cond()


def test_poller_reports_each_completion_once() -> None:
    poller = CompletionPoller("t", lambda: None)
    works = [FakeWork() for _ in range(3)]
    seen: list[tuple[int, object]] = []
    for i, w in enumerate(works):
        poller.add(w, lambda err, i=i: seen.append((i, err)))
    works[1].done.set()
    assert until(lambda: len(seen) == 1)
    assert seen == [(1, None)]
    works[0].done.set()
    works[2].done.set()
    assert until(lambda: len(seen) == 3)
    assert sorted(i for i, _ in seen) == [0, 1, 2] and all(e is None for _, e in seen)
    assert poller.pending() == 0
    poller.stop()


def test_poller_fails_every_pending_op_on_an_engine_error() -> None:
    broken: list[str] = []
    poller = CompletionPoller("t", lambda: broken[0] if broken else None)
    errors: list[BaseException | None] = []
    for _ in range(2):
        poller.add(FakeWork(), errors.append)
    broken.append("NCCL communicator reported REMOTE_ERROR")
    assert until(lambda: len(errors) == 2)
    assert all(isinstance(e, EngineFailed) and "REMOTE_ERROR" in str(e) for e in errors)
    poller.stop()


def test_stopped_poller_fails_new_work_at_once() -> None:
    poller = CompletionPoller("t", lambda: None)
    poller.stop()
    errors: list[BaseException | None] = []
    poller.add(FakeWork(), errors.append)
    assert len(errors) == 1 and isinstance(errors[0], EngineFailed)


class StreamBackend(TorchCommBackend):
    """A CPU backend whose all-reduce is 'on a stream': completed only when the test says so."""

    backend_name = "stream-test"
    capabilities = BackendCapabilities(devices=("cpu",))
    works: list[FakeWork] = []

    def init(self) -> None:
        self.poller = CompletionPoller(self.ctx.name, lambda: None)

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> EngineHandle:
        w = FakeWork()
        type(self).works.append(w)
        return StreamOrderedHandle(w, self.poller)

    def abort(self) -> None:
        self.poller.stop()

    finalize = abort


@pytest.fixture
def comm():  # noqa: ANN201
    torchcomms.register_backend("stream-test", StreamBackend)
    StreamBackend.works = []
    c = torchcomms.new_comm("stream-test", torch.device("cpu"), name=f"stream-{time.monotonic_ns()}",
                            timeout=timedelta(seconds=30), hints={"rank": "0", "size": "1"})
    yield c
    c.abort()


def test_sync_op_waits_by_stream_and_completes_later(comm) -> None:  # noqa: ANN001
    t0 = time.monotonic()
    w = comm.all_reduce(torch.ones(4), ReduceOp.SUM, False)  # would block forever on the host
    assert time.monotonic() - t0 < 5.0
    [fw] = StreamBackend.works
    assert fw.stream_waits == 1 and not w.is_completed()
    assert w.wait() is True and fw.stream_waits == 2  # wait() again: by stream again
    fw.done.set()
    assert w.wait_blocking(timeout=5.0) is True
    assert w.is_completed() and w.status is torchcomms.WorkStatus.COMPLETED
    assert w.wait() is True and fw.stream_waits == 2  # done: no stream wait needed


def test_watchdog_ends_a_stream_ordered_op_at_its_deadline(comm) -> None:  # noqa: ANN001
    w = comm.all_reduce(torch.ones(4), ReduceOp.SUM, True, timeout=timedelta(seconds=0.3))
    w.wait()  # by stream: returns at once
    # nobody blocks on it: the watchdog alone must end it
    assert until(lambda: w.status is torchcomms.WorkStatus.TIMEDOUT, limit=0.3 + 2.0)
    with pytest.raises(CommTimeoutError):
        w.wait_blocking()
    with pytest.raises(CommTimeoutError):
        w.wait()  # ended: the error shows
    assert comm.is_broken()


def test_finalize_waits_on_the_host_for_stream_ordered_work() -> None:
    torchcomms.register_backend("stream-test", StreamBackend)
    StreamBackend.works = []
    c = torchcomms.new_comm("stream-test", torch.device("cpu"), name=f"stream-fin-{time.monotonic_ns()}",
                            timeout=timedelta(seconds=30), hints={"rank": "0", "size": "1"})
    c.all_reduce(torch.ones(4), ReduceOp.SUM, True)
    [fw] = StreamBackend.works
    threading.Timer(0.3, fw.done.set).start()
    t0 = time.monotonic()
    c.finalize()
    assert fw.done.is_set() and time.monotonic() - t0 >= 0.2
