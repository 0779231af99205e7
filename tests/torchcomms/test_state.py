"""The communicator's lifecycle: one transition table, and every other move refused."""
from __future__ import annotations

from datetime import timedelta

import pytest
import torch

import torchcomms
from torchcomms import CommAbortedError, ReduceOp
from torchcomms.core.errors import CommError
from torchcomms.core.state import RETIRED, TRANSITIONS, CommState, IllegalTransition, Lifecycle


def test_the_table_covers_every_state_and_retired_states_never_become_usable() -> None:
    assert set(TRANSITIONS) == set(CommState)
    for state in RETIRED:
        assert CommState.ACTIVE not in TRANSITIONS[state]
        assert CommState.BROKEN not in TRANSITIONS[state]
    assert TRANSITIONS[CommState.FINALIZED] == frozenset() and TRANSITIONS[CommState.EXPELLED] == frozenset()


@pytest.mark.parametrize("start,to", [
    (start, to) for start in CommState for to in CommState if to not in TRANSITIONS[start]
])
def test_an_illegal_transition_raises(start: CommState, to: CommState) -> None:
    life = Lifecycle("c")
    life.state = start
    assert not life.can(to)
    with pytest.raises(IllegalTransition, match=f"cannot go from {start.value} to {to.value}") as info:
        life.move(to)
    assert isinstance(info.value, CommError) and "comm 'c'" in str(info.value)
    assert life.state is start  # unchanged


def test_a_legal_path_through_the_table() -> None:
    life = Lifecycle("c")
    for to in (CommState.BROKEN, CommState.RECONFIGURING, CommState.ACTIVE, CommState.REVOKED,
               CommState.RECONFIGURING, CommState.FINALIZED):
        life.move(to)
        assert life.state is to
    assert life.retired


def test_a_communicator_walks_the_table() -> None:
    c = torchcomms.new_comm("fake", "cpu", "state-walk", hints={"rank": "0", "size": "2"},
                            timeout=timedelta(seconds=5))
    assert "active" in repr(c)
    c.all_reduce(torch.ones(2), ReduceOp.SUM, False)
    c.abort()
    assert c.is_aborted() and "aborted" in repr(c)
    with pytest.raises(CommAbortedError, match="communicator is aborted"):
        c.all_reduce(torch.ones(2), ReduceOp.SUM, False)
    c.abort()  # idempotent: aborted -> aborted is no move
    c.finalize()  # a retired communicator stays as it is
    assert "aborted" in repr(c)
