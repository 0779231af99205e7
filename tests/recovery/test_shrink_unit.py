"""shrink() semantics on the fake backend (one process): who is broken, what the old and the
split-off communicators do afterwards. Multi-process behaviour is in test_chaos.py."""
from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import torchcomms
from torchcomms import CommAbortedError, ReduceOp
from torchcomms.recovery.agreement import agree_on_survivors


def test_split_children_are_independent_of_a_shrunk_parent() -> None:
    store = dist.HashStore()
    parent = torchcomms.new_comm("fake", "cpu", "p", store=store, hints={"rank": "0", "size": "4"})
    child = parent.split([0, 1], "child")
    assert child is not None
    # rank 3 fails: the parent (a member) breaks; the child (not a member) carries on
    parent.notify_peer_failure([3], "exited")
    child.notify_peer_failure([3], "exited")
    assert parent.is_broken() and not child.is_broken()
    x = torch.ones(2)
    child.all_reduce(x, ReduceOp.SUM, False)
    assert x.tolist() == [2.0, 2.0]
    # in this one-process world only rank 0 checks in: the deadline decides
    new = parent.shrink(timeout=timedelta(seconds=0.3))
    assert new.get_size() == 1 and new.get_global_ranks() == [0] and new.get_name() == "p"
    with pytest.raises(CommAbortedError, match="shrunk"):
        parent.split([0], "again")
    with pytest.raises(CommAbortedError, match="shrunk"):
        parent.all_reduce(x, ReduceOp.SUM, False)
    again = new.split([0], "from-new")
    assert again is not None and again.get_size() == 1
    for c in (again, new, child, parent):
        c.finalize()


def test_shrink_keeps_hooks_and_resets_sequence_numbers() -> None:
    comm = torchcomms.new_comm("fake", "cpu", "h", store=dist.HashStore(), hints={"rank": "0", "size": "2"})
    seqs: list[int] = []
    comm.register_pre_hook(lambda name, op_id, rec: seqs.append(rec.seq))
    comm.barrier(False)
    comm.notify_peer_failure([1], "heartbeat")
    new = comm.shrink(timeout=timedelta(seconds=0.2))
    new.barrier(False)
    assert seqs == [1, 1]
    new.finalize()
    comm.finalize()


def test_agreement_first_proposal_wins() -> None:
    store = dist.HashStore()
    # rank 2 decides early (it knows rank 1 failed); rank 0 arrives later and adopts that decision
    d2 = agree_on_survivors(store, "k", 2, [0, 1, 2], lambda: {0, 1}, deadline=float("inf"))
    d0 = agree_on_survivors(store, "k", 0, [0, 1, 2], lambda: set(), deadline=float("inf"))
    assert d2 == d0 == [2]
