"""A completed gloo op holds none of its tensors once its caller let go of them."""
from __future__ import annotations

import weakref
from typing import Any

from tests.helpers.ranks import run_ranks


def test_completed_async_ops_release_their_tensors_and_engine_copies() -> None:
    # gloo's async reduce-scatter has no future: a helper thread waits on it. That thread held
    # its last op (input, output, and gloo's copy of the whole input) until it was handed the
    # next one; and the futures of done ops were kept (their values: the outputs) until the
    # communicator's next op. FSDP2 kept 18 MiB of gradient buffers across steps that way.
    # finalize() lets go of the engine: a rank that had received kept it (its last receive from
    # each peer held it) until the interpreter's teardown destroyed it, where 2 in 10 jobs of a
    # probe ended in "terminate called without an active exception" (SIGABRT); and its p2p
    # helper threads end (each communicator that ran a p2p op left one behind: 30 after 30).
    for r in run_ranks(2, "tests.torchcomms.release_workers:completed_async_ops_hold_nothing", timeout=120):
        assert r.value == {"reduce_scatter_single": 0, "all_gather_single": 0, "all_reduce": 0,
                           "engine_alive_after_finalize": False, "p2p_threads_after_finalize": 0}, (r.rank, r.value)


def test_p2p_waiter_is_idle_only_once_its_threads_returned_from_completing() -> None:
    """The helper threads completing gloo's p2p futures: torch's ``set_result`` releases the
    interpreter's lock while the future's callbacks run and takes it again after. A thread still
    there when the interpreter's finalization began was ended inside C++ ("terminate called
    without an active exception": 3 in 8 exits after a timed-out receive), so the engine's exit
    release waits until none is (``wait_idle``)."""
    import threading

    import torch.distributed as dist

    from torchcomms.backends.gloo import _BlockingWaiter

    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, opts)
    opened, callback_may_end = threading.Event(), threading.Event()

    class Gated:
        """A real barrier of the engine, reported done only once ``opened`` is set. It holds the
        work, not the process group: a class is part of a reference cycle, so a group its methods
        named would outlive the test as garbage of the pytest process, which a forked child would
        then finalize (and hang in ``~ProcessGroupGloo``)."""

        def __init__(self, work: Any) -> None:
            self.work = work

        def wait(self) -> None:
            opened.wait(10)
            self.work.wait()

    waiter = _BlockingWaiter()
    fut = waiter.future_of(Gated(pg.barrier()))
    fut.add_done_callback(lambda _: callback_may_end.wait(10))  # added before the work is done
    opened.set()
    assert waiter.wait_idle(0.3) is False  # its thread is inside set_result, running the callback
    callback_may_end.set()
    assert waiter.wait_idle(10) is True
    assert fut.done()
    group = weakref.ref(pg)
    del pg, fut
    assert group() is None  # freed now, not left to the collector
