"""reconfigure() against its own engine build (one process, fake backend): a build that ends
after its reconfigure was aborted, superseded or timed out never rebinds the communicator.
The build is held on an event, so each interleaving is forced. Multi-process: test_reconfigure.py."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch

import torchcomms
from torchcomms import CommAbortedError, CommTimeoutError, ReduceOp
from torchcomms.backends.fake import FakeBackend


@pytest.fixture
def held_builds(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Every engine build (``split``) hands its engine back only once the event is set."""
    release = threading.Event()
    real = FakeBackend.split

    def held(self: FakeBackend, ctx):  # type: ignore[no-untyped-def]
        child = real(self, ctx)
        release.wait(30)
        return child

    monkeypatch.setattr(FakeBackend, "split", held)
    yield release
    release.set()


def _comm(name: str) -> torchcomms.TorchComm:
    return torchcomms.new_comm("fake", "cpu", name, enable_reconfigure=True, hints={"rank": "0", "size": "1"},
                               timeout=timedelta(seconds=20))


def _join_builds(name: str) -> None:
    for t in threading.enumerate():
        if t.name == f"torchcomms-reconfigure-{name}":
            t.join(10)
            assert not t.is_alive()


def test_abort_during_a_reconfigure_ends_it_and_the_late_engine_is_not_bound(held_builds) -> None:
    comm = _comm("reconf-abort")
    handle = comm.get_init_handle()
    work = comm.reconfigure("a", [handle])
    comm.abort()
    t0 = time.monotonic()
    with pytest.raises(CommAbortedError):
        work.wait()  # at once, not when the build ends or at the deadline
    assert time.monotonic() - t0 < 5
    held_builds.set()
    _join_builds("reconf-abort")
    assert comm.is_aborted()
    with pytest.raises(CommAbortedError):
        comm.barrier(False)
    # a revoked communicator can still be re-formed
    held_builds.set()
    comm.reconfigure("b", [handle]).wait()
    x = torch.ones(1)
    comm.all_reduce(x, ReduceOp.SUM, False)
    assert x.item() == 1.0
    comm.finalize()


def test_a_later_reconfigure_supersedes_one_still_in_progress(held_builds) -> None:
    comm = _comm("reconf-twice")
    handle = comm.get_init_handle()
    first = comm.reconfigure("first", [handle])
    second = comm.reconfigure("second", [handle])
    with pytest.raises(CommAbortedError, match="superseded"):
        first.wait()
    held_builds.set()
    assert second.wait() is True
    _join_builds("reconf-twice")
    assert "/reconf/second/" in comm._ctx.store_prefix  # the first's engine, done last or not, is unused
    comm.barrier(False)
    comm.finalize()


def test_a_reconfigure_that_timed_out_leaves_the_communicator_broken(held_builds) -> None:
    comm = _comm("reconf-late")
    handle = comm.get_init_handle()
    work = comm.reconfigure("late", [handle], timeout=timedelta(seconds=0.3))
    with pytest.raises(CommTimeoutError):
        work.wait()
    held_builds.set()
    _join_builds("reconf-late")
    assert comm.is_broken()
    with pytest.raises(CommAbortedError):
        comm.barrier(False)
    comm.reconfigure("retry", [handle]).wait()
    comm.barrier(False)
    comm.finalize()
