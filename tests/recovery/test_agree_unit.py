"""``agree`` semantics in one process (the fake backend, a HashStore playing the other members'
votes). Multi-process behaviour is in test_agree.py and test_chaos.py."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

import torchcomms
from torchcomms import CommAbortedError, CommTypeError
from torchcomms.recovery.agreement import agree_on_flag


def _comm(name: str, size: int = 3) -> tuple[torchcomms.TorchComm, dist.Store]:
    store = dist.HashStore()
    return torchcomms.new_comm("fake", "cpu", name, store=store, hints={"rank": "0", "size": str(size)}), store


def test_all_yes_is_true_and_a_no_anywhere_is_false() -> None:
    store = dist.HashStore()
    never = lambda: set()  # noqa: E731
    for r in (1, 2):
        store.set(f"a/yes/{r}", b"1")
    assert agree_on_flag(store, "a", 0, [0, 1, 2], True, never, time.monotonic() + 5) is True
    # a member that votes no decides at once; one that votes yes later adopts that decision
    assert agree_on_flag(store, "b", 1, [0, 1, 2], False, never, time.monotonic() + 5) is False
    assert agree_on_flag(store, "b", 0, [0, 1, 2], True, never, time.monotonic() + 5) is False


def test_a_member_known_failed_is_not_waited_for_and_a_silent_one_counts_as_no() -> None:
    store = dist.HashStore()
    store.set("k/yes/1", b"1")
    t0 = time.monotonic()
    assert agree_on_flag(store, "k", 0, [0, 1, 2], True, lambda: {2}, t0 + 30) is True
    assert time.monotonic() - t0 < 5  # decided without waiting for the failed member
    # rank 2 is alive but never votes: at the deadline the answer is no, for everyone after too
    assert agree_on_flag(store, "s", 0, [0, 1, 2], True, lambda: set(), time.monotonic() + 0.2) is False
    assert agree_on_flag(store, "s", 1, [0, 1, 2], True, lambda: set(), time.monotonic() + 5) is False


def test_concurrent_voters_all_return_the_same_value() -> None:
    store = dist.HashStore()
    got: dict[int, bool] = {}
    flags = {0: True, 1: True, 2: False, 3: True}

    def vote(r: int) -> None:
        got[r] = agree_on_flag(store, "c", r, list(flags), flags[r], lambda: set(), time.monotonic() + 10)

    threads = [threading.Thread(target=vote, args=(r,)) for r in flags]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert got == {r: False for r in flags}


def test_agree_on_a_broken_communicator_and_its_refusals() -> None:
    comm, store = _comm("ag")
    for n in (1, 2):  # the other two members vote yes in rounds 1 and 2 of this communicator
        for r in (1, 2):
            store.set(f"{comm._core.ctx.store_prefix}/agree{n}/yes/{r}", b"1")  # noqa: SLF001
    assert comm.agree(True) is True
    comm.notify_peer_failure([2], "exited")
    assert comm.is_broken()
    assert comm.agree(True, timeout=timedelta(seconds=5)) is True  # rank 2 excluded, rank 1 said yes
    assert comm.agree(False) is False  # round 3: a no decides alone
    with pytest.raises(CommTypeError, match="flag must be a bool"):
        comm.agree(1)  # type: ignore[arg-type]
    new = comm.shrink(timeout=timedelta(seconds=0.3))
    with pytest.raises(CommAbortedError, match="shrunk"):
        comm.agree(True)
    assert new.agree(True, timeout=timedelta(seconds=2)) is True  # a communicator of one
    new.finalize()
    with pytest.raises(CommAbortedError):
        new.agree(True)
