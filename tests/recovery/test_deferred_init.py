"""``new_comm(..., enable_reconfigure=True, hints={"deferred_init": "true"})``: a communicator of
this rank alone (its job rank kept), formed with others by ``reconfigure``; and ``job_store``.
Multi-process use (a replacement replica joining survivors): tests/fsdp2/test_elastic.py."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import torchcomms
from torchcomms import ReduceOp


def test_a_deferred_communicator_is_this_rank_alone_until_reconfigured() -> None:
    comm = torchcomms.new_comm("fake", "cpu", "deferred-a", enable_reconfigure=True, store=dist.HashStore(),
                               hints={"rank": "3", "size": "4", "deferred_init": "true"})
    assert (comm.get_rank(), comm.get_size(), comm.get_global_ranks()) == (0, 1, [3])
    handle = comm.get_init_handle()
    assert handle.split("/")[4] == "3"  # the handle names the job rank
    assert comm.reconfigure("solo", [handle]).wait() is True
    t = torch.ones(2)
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert comm.get_global_ranks() == [3] and t.tolist() == [1.0, 1.0]
    comm.finalize()


def test_deferred_init_needs_enable_reconfigure() -> None:
    with pytest.raises(torchcomms.CommValueError, match="enable_reconfigure"):
        torchcomms.new_comm("fake", "cpu", "deferred-b", hints={"rank": "0", "size": "2", "deferred_init": "true"})


def test_deferred_init_must_be_true_or_false() -> None:
    with pytest.raises(torchcomms.CommValueError, match="deferred_init"):
        torchcomms.new_comm("fake", "cpu", "deferred-c", enable_reconfigure=True,
                            hints={"rank": "0", "size": "2", "deferred_init": "yes"})


def test_job_store_checks_its_timeout() -> None:
    with pytest.raises(torchcomms.CommTypeError, match="timedelta"):
        torchcomms.job_store(5)  # type: ignore[arg-type]
