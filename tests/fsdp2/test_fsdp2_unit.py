"""fsdp2 pieces that need no peers: op mapping, argument errors, the Work wrapper."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import fsdp2
import torchcomms
from fsdp2.collectives import comms_op


def test_reduce_ops_map_to_torchcomms() -> None:
    assert comms_op(dist.ReduceOp.AVG).type is torchcomms.RedOpType.AVG
    assert comms_op(dist.ReduceOp.SUM).type is torchcomms.RedOpType.SUM
    assert comms_op(dist.ReduceOp.RedOpType.AVG).type is torchcomms.RedOpType.AVG
    assert comms_op(dist.ReduceOp.MAX).type is torchcomms.RedOpType.MAX


def test_premul_sum_keeps_its_factor() -> None:
    from torch.distributed.distributed_c10d import ReduceOp

    cases = [(dist._make_nccl_premul_sum(0.5), 0.5)]
    if callable(ReduceOp.PREMUL_SUM):  # a factory on torch 2.13; 2.11 has only the enum member
        cases.append((ReduceOp.PREMUL_SUM(0.25), 0.25))
    for c10d_op, want in cases:
        op = comms_op(c10d_op)
        assert op.type is torchcomms.RedOpType.PREMUL_SUM and op.factor == want
    t = comms_op(dist._make_nccl_premul_sum(torch.tensor(0.125)))
    assert isinstance(t.factor, torch.Tensor) and t.factor.item() == 0.125
    with pytest.raises(fsdp2.FSDPCommError, match="no torchcomms equivalent"):
        comms_op("not an op")


def test_bad_arguments_raise_typed_errors() -> None:
    with pytest.raises(fsdp2.FSDPCommError, match="TorchComm"):
        fsdp2.fully_shard(torch.nn.Linear(2, 2), object())
    comm = torchcomms.new_comm("fake", torch.device("cpu"), name="fsdp2-unit-bad-args")
    try:
        with pytest.raises(fsdp2.FSDPCommError, match="replicate_size"):
            fsdp2.FSDPComms.build(comm, replicate_size=0)
        with pytest.raises(fsdp2.FSDPCommError, match="prefetch"):
            fsdp2.fully_shard(torch.nn.Linear(2, 2), comm, prefetch=-1)
        with pytest.raises(fsdp2.FSDPCommError, match="mesh"):
            fsdp2.fully_shard(torch.nn.Linear(2, 2), comm, mesh=None)
        with pytest.raises(fsdp2.FSDPCommError, match="overlap must be a bool"):
            fsdp2.fully_shard(torch.nn.Linear(2, 2), comm, overlap="no")
    finally:
        comm.finalize()


def test_replicate_size_other_than_an_fsdp_comms_own_is_refused() -> None:
    # an FSDPComms carries its layout: another replicate_size beside it is an error, never ignored
    comms = fsdp2.FSDPComms(parent=None, replicate_size=2, shard_size=2, all_gather=None, reduce_scatter=None,
                            all_reduce=None, mesh=None, global_mesh=None, separate=True)  # type: ignore[arg-type]
    assert fsdp2.fsdp_comms(comms) is comms and fsdp2.fsdp_comms(comms, replicate_size=2) is comms
    with pytest.raises(fsdp2.FSDPCommError, match="replicate_size=4 differs from the given FSDPComms' 2"):
        fsdp2.fully_shard(torch.nn.Linear(2, 2), comms, replicate_size=4)


@pytest.mark.parametrize("kwargs", [{"overlap": True}, {"replicate_size": 2}, {"overlap": False, "replicate_size": 1}])
def test_elastic_fully_shard_refuses_the_layout_arguments_it_sets_itself(kwargs) -> None:
    from fsdp2.elastic import ElasticHSDP

    el = ElasticHSDP.__new__(ElasticHSDP)  # the check comes before anything of a running job
    with pytest.raises(fsdp2.FSDPCommError, match="sets .* itself"):
        el.fully_shard(torch.nn.Linear(2, 2), **kwargs)


def test_comm_work_is_a_torch_work_that_waits_on_the_torchcomms_work() -> None:
    comm = torchcomms.new_comm("fake", torch.device("cpu"), name="fsdp2-unit-work")
    try:
        t = torch.ones(4)
        w = fsdp2.CommWork(comm.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=True))
        assert isinstance(w, dist.Work)
        assert w.wait() is True and w.is_completed() and w.is_success() and w.exception() is None
    finally:
        comm.finalize()


def test_not_sharded_module_is_named() -> None:
    with pytest.raises(fsdp2.FSDPCommError, match="Linear"):
        fsdp2.comms_of(torch.nn.Linear(2, 2))


class _Done:
    """A finished op (what CommWork needs of a TorchWork)."""

    def __init__(self) -> None:
        self.waited = 0

    def wait(self, timeout=None) -> bool:  # noqa: ANN001
        self.waited += 1
        return True


def _backward_that_reduces(reductions: fsdp2.Reductions, work: _Done, fail: bool) -> None:
    x = torch.ones(2, requires_grad=True)

    def hook(grad: torch.Tensor) -> torch.Tensor:
        reductions.add(fsdp2.CommWork(work))
        if fail:
            raise RuntimeError("peer died")
        return grad

    y = x * 2
    y.register_hook(hook)
    y.sum().backward()


def test_reductions_are_drained_before_backward_returns() -> None:
    r, w = fsdp2.Reductions(), _Done()
    _backward_that_reduces(r, w, fail=False)
    assert w.waited == 1 and r.pending() == 0


def test_a_backward_that_raised_does_not_stop_the_next_drain() -> None:
    r = fsdp2.Reductions()
    with pytest.raises(RuntimeError, match="peer died"):
        _backward_that_reduces(r, _Done(), fail=True)
    r.new_pass()  # fsdp2 calls it from every sharded module's forward pre-hook
    w = _Done()
    _backward_that_reduces(r, w, fail=False)
    assert w.waited == 1 and r.pending() == 0


def test_reductions_keep_at_most_their_bound_in_flight_oldest_waited_first() -> None:
    r = fsdp2.Reductions(max_in_flight=2)
    works = [_Done() for _ in range(5)]
    for i, w in enumerate(works):
        r.add(fsdp2.CommWork(w))
        assert r.pending() == min(i + 1, 2)
        assert [x.waited for x in works] == [1] * max(0, i - 1) + [0] * (len(works) - max(0, i - 1))
    r.drain()
    assert [x.waited for x in works] == [1] * 5 and r.pending() == 0
    with pytest.raises(fsdp2.FSDPCommError, match="at least 1"):
        fsdp2.Reductions(max_in_flight=0)


def test_an_error_of_a_reduction_waited_past_the_bound_is_raised_by_the_drain() -> None:
    class _Failed(_Done):
        def wait(self, timeout=None) -> bool:  # noqa: ANN001
            raise torchcomms.PeerFailureError("peer 1 failed", failed_ranks=[1])

    r = fsdp2.Reductions(max_in_flight=1)
    r.add(fsdp2.CommWork(_Failed()))
    r.add(fsdp2.CommWork(_Done()))  # waits the failed one: its error is kept for the drain
    with pytest.raises(torchcomms.PeerFailureError, match="peer 1 failed"):
        r.drain()


def test_a_second_waiter_returns_only_after_the_first_ran_the_copy_out() -> None:
    # On gloo a reduce-scatter's output is filled by CommWork's after() (the copy-out of an
    # in-place all-reduce). HSDP's replica all-reduce is chained on a worker thread that waits on
    # the same work as the main thread's Reductions: whoever came second returned at once and
    # could all-reduce an output still being written (HSDP's losses left stock's at step 12).
    import threading

    in_after, release, done = threading.Event(), threading.Event(), []

    def after() -> None:
        in_after.set()
        release.wait(10)
        done.append(True)

    w = fsdp2.CommWork(_Done(), after)
    first = threading.Thread(target=w.wait)
    first.start()
    assert in_after.wait(10)
    seen: list[bool] = []
    second = threading.Thread(target=lambda: (w.wait(), seen.append(bool(done))))
    second.start()
    second.join(1.0)  # long enough for a second waiter that does not block to have returned
    release.set()
    first.join(10)
    second.join(10)
    assert seen == [True] and done == [True]  # after() ran once, before the second wait returned
