"""Rank targets for test_mismatch.py: ranks whose calls do not fit together."""
from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch

import torchcomms
from tests.torchcomms.workers import engine


#: the communicators ``_comm`` made for the target running in this process (one at a time)
_MADE: list[torchcomms.TorchComm] = []
_T = TypeVar("_T")


def _comm(name: str = "mm") -> torchcomms.TorchComm:
    """A communicator of the engine under test (``TC_BACKEND``, gloo by default)."""
    comm = torchcomms.new_comm(engine(), "cpu", name, timeout=timedelta(seconds=30))
    _MADE.append(comm)
    comm.barrier(False)
    return comm


def _finalizes(target: Callable[..., _T]) -> Callable[..., _T]:
    """``target``, finalizing the communicators it made once it returned: an MPI pool job
    (``tests/helpers/mpi_pool.py``) then serves the next test instead of ending."""
    @functools.wraps(target)
    def run(*args: Any, **kwargs: Any) -> _T:
        try:
            return target(*args, **kwargs)
        finally:
            while _MADE:
                _MADE.pop().finalize()
    return run


def _outcome(fn) -> str:
    try:
        fn()
    except torchcomms.CommError as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


@_finalizes
def p2p(sent: list[int], sent_dtype: str, expected: list[int], expected_dtype: str) -> str:
    """Rank 0 sends a tensor of shape ``sent``; rank 1 receives into one of shape ``expected``."""
    comm = _comm()
    t = timedelta(seconds=10)
    if comm.get_rank() == 0:
        return _outcome(lambda: comm.send(torch.ones(sent, dtype=getattr(torch, sent_dtype)), 1, False, timeout=t))
    return _outcome(lambda: comm.recv(torch.empty(expected, dtype=getattr(torch, expected_dtype)), 0, False,
                                      timeout=t))


@_finalizes
def p2p_in_order(sizes: list[int]) -> list[list[float]]:
    """Rank 0 sends one tensor per size (values = its index), rank 1 posts every receive at
    once (async) and returns what arrived: each must land in its own receive."""
    comm = _comm()
    if comm.get_rank() == 0:
        works = [comm.send(torch.full((n,), float(i)), 1, True) for i, n in enumerate(sizes)]
        for w in works:
            w.wait()
        batch = comm.batch_op_create()
        for i, n in enumerate(sizes):
            batch.send(torch.full((n,), float(10 + i)), 1)
        batch.issue(False)
        return []
    bufs = [torch.empty(n) for n in sizes]
    works = [comm.recv(b, 0, True) for b in bufs]
    for w in works:
        w.wait()
    more = [torch.empty(n) for n in sizes]
    batch = comm.batch_op_create()
    for b in more:
        batch.recv(b, 0)
    batch.issue(False)
    return [sorted(set(b.tolist())) for b in bufs + more]


def split_lists(lists: dict[str, list[int]]) -> str:
    """Each rank splits with its own list (``lists[str(rank)]``)."""
    comm = _comm()
    mine = lists[str(comm.get_rank())]
    outcome = _outcome(lambda: comm.split(mine, "child", timeout=timedelta(seconds=10)))
    # rank 0 hosts the store: it stays until every rank's split (and its engine's rendezvous
    # through that store) has ended, or its exit fails a peer's split that was still reading
    _outcome(lambda: comm.barrier(False, timeout=timedelta(seconds=10)))
    return outcome


def wrong_all_gather_size() -> str:
    """Rank 0 passes an all_gather output one element short; rank 1's is right. Rank 0 stays
    alive (it caught its error) while rank 1 waits."""
    comm = _comm()
    r = comm.get_rank()
    out = torch.empty(3 if r == 0 else 4)
    res = _outcome(lambda: comm.all_gather_single(out, torch.ones(2), False, timeout=timedelta(seconds=3)))
    if r == 0:
        time.sleep(6)
    return res


@_finalizes
def batch_p2p(sent: list[int], expected: list[int]) -> str:
    """Rank 0 sends one float32 tensor per entry of ``sent`` in a batch (then a recv of one
    element); rank 1 receives them in a batch into buffers of ``expected`` sizes (and sends one)."""
    comm = _comm()
    t = timedelta(seconds=10)
    batch = comm.batch_op_create()
    if comm.get_rank() == 0:
        for n in sent:
            batch.send(torch.ones(n), 1)
        batch.recv(torch.empty(1), 1)
    else:
        batch.send(torch.ones(1), 0)
        for n in expected:
            batch.recv(torch.empty(n), 0)
    return _outcome(lambda: batch.issue(False, torchcomms.BatchP2POptions(timeout=t)))


@_finalizes
def recv_any_source(sent: int, expected: int) -> str:
    """Rank 1 sends ``sent`` float32 elements; rank 0 receives from any source into ``expected``."""
    comm = _comm()
    t = timedelta(seconds=10)
    if comm.get_rank() == 1:
        return _outcome(lambda: comm.send(torch.ones(sent), 0, False, timeout=t))
    return _outcome(lambda: comm.recv_any_source(torch.empty(expected), False, timeout=t))


def all_reduce_sizes(sizes: list[int]) -> str:
    """Each rank all-reduces a float32 tensor of its own ``sizes[rank]`` elements (3 s deadline)."""
    comm = _comm()
    n = sizes[comm.get_rank()]
    return _outcome(lambda: comm.all_reduce(torch.ones(n), torchcomms.ReduceOp.SUM, False,
                                            timeout=timedelta(seconds=3)))


def check_modes(modes: list[str]) -> str:
    """Each rank makes a communicator with its own collective check hint (``modes[rank]``; ""
    leaves it to ``TORCHCOMM_CHECK_COLLECTIVES``) and runs a barrier on it. Rank 0, whose process
    hosts the store, leaves only once every rank has its outcome."""
    import os

    from tests.helpers.rank_sync import reach

    mode = modes[int(os.environ.get("TORCHCOMM_RANK") or os.environ["OMPI_COMM_WORLD_RANK"])]
    hints = {"torchcomms.check_collectives": mode} if mode else {}

    def make_and_use() -> None:
        # the refusal comes once the engine's rendezvous is done: the timeout only bounds the
        # ranks' start-up skew (the barrier's, how long ranks that were not refused wait)
        comm = torchcomms.new_comm(engine(), "cpu", "mm", timeout=timedelta(seconds=60), hints=hints)
        comm.barrier(False, timeout=timedelta(seconds=5))
        comm.finalize()

    outcome = _outcome(make_and_use)
    reach("ended")
    return outcome


def _call(comm: torchcomms.TorchComm, op: str, n: int, timeout: timedelta) -> None:
    """``op`` on tensors of ``n`` float32 elements per rank (root 0)."""
    r, w, s = comm.get_rank(), comm.get_size(), torchcomms.ReduceOp.SUM
    ones, empty = (lambda: torch.ones(n)), (lambda: torch.empty(n))
    many = lambda k: [torch.empty(n) for _ in range(k)]  # noqa: E731
    calls = {
        "all_reduce": lambda: comm.all_reduce(ones(), s, False, timeout=timeout),
        "reduce": lambda: comm.reduce(ones(), 0, s, False, timeout=timeout),
        "broadcast": lambda: comm.broadcast(ones(), 0, False, timeout=timeout),
        "all_gather": lambda: comm.all_gather(many(w), ones(), False, timeout=timeout),
        "all_gather_single": lambda: comm.all_gather_single(torch.empty(n * w), ones(), False, timeout=timeout),
        "all_gather_v": lambda: comm.all_gather_v(many(w), ones(), False, timeout=timeout),
        "reduce_scatter": lambda: comm.reduce_scatter(empty(), [ones() for _ in range(w)], s, False, timeout=timeout),
        "reduce_scatter_single": lambda: comm.reduce_scatter_single(empty(), torch.ones(n * w), s, False,
                                                                    timeout=timeout),
        "all_to_all_single": lambda: comm.all_to_all_single(torch.empty(n * w), torch.ones(n * w), False,
                                                            timeout=timeout),
        "all_to_all": lambda: comm.all_to_all(many(w), [ones() for _ in range(w)], False, timeout=timeout),
        "scatter": lambda: comm.scatter(empty(), [ones() for _ in range(w)] if r == 0 else None, 0, False,
                                        timeout=timeout),
        "gather": lambda: comm.gather(many(w) if r == 0 else None, ones(), 0, False, timeout=timeout),
        "all_reduce_then_send": lambda: _all_reduce_then_send(comm, n, timeout),
        "all_reduce_then_exit": lambda: comm.all_reduce(ones(), s, False, timeout=timeout),
    }
    calls[op]()


def _all_reduce_then_send(comm: torchcomms.TorchComm, n: int, timeout: timedelta) -> None:
    """An async all_reduce, then (rank 1, once its engine's network thread met the longer message)
    a send to rank 0 on the same communicator, which is not broken yet; then the all_reduce's wait."""
    work = comm.all_reduce(torch.ones(n), torchcomms.ReduceOp.SUM, True, timeout=timeout)
    if comm.get_rank() == 1:
        backend = comm._core.backend
        end = time.monotonic() + timeout.total_seconds()
        while backend._receive_overflow() is None and time.monotonic() < end:
            time.sleep(0.01)
        comm.send(torch.ones(1), 0, False, timeout=timeout)
    work.wait()


def collective_sizes(ops: dict[str, int]) -> dict[str, list[str]]:
    """For each op of ``ops`` (its name: the rank whose tensors have 8 elements, the other's 4),
    a communicator of its own on which every rank calls the op: each rank's outcome of the op,
    then of a barrier on the same communicator. Each rank finalizes the communicator then, which
    abandons a broken one's engine: its peer's op fails at once instead of at its deadline. For an
    op named ``*_then_exit`` it runs the engines' release at the interpreter's exit instead."""
    from torchcomms.backends import exit_release

    t = timedelta(seconds=10)
    outcomes = {}
    for op, big in ops.items():
        comm = torchcomms.new_comm(engine(), "cpu", f"mm_{op}", timeout=timedelta(seconds=30))
        n = 8 if comm.get_rank() == big else 4
        outcomes[op] = [_outcome(lambda: _call(comm, op, n, t)), _outcome(lambda: comm.barrier(False, timeout=t))]
        if op.endswith("_then_exit"):
            exit_release._release_all()  # what atexit runs: the engine was never finalized
        else:
            comm.finalize()
    return outcomes


def skipped_reduce_scatter() -> str:
    """Rank 0 runs a synchronous reduce_scatter_single (1 s deadline) that rank 1 never calls;
    rank 1 leaves only once rank 0 has its outcome."""
    from tests.helpers.rank_sync import reach

    comm = _comm()
    outcome = "ok"
    if comm.get_rank() == 0:
        outcome = _outcome(lambda: comm.reduce_scatter_single(torch.empty(2), torch.ones(4), torchcomms.ReduceOp.SUM,
                                                              False, timeout=timedelta(seconds=1)))
    reach("outcome", timeout=20)
    return outcome
