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
        store.set(f"a/agree1/yes/{r}", b"1")
    assert agree_on_flag(store, "a", 1, 0, [0, 1, 2], True, never, time.monotonic() + 5) is True
    # a member that votes no decides at once; one that votes yes later adopts that decision
    assert agree_on_flag(store, "b", 1, 1, [0, 1, 2], False, never, time.monotonic() + 5) is False
    assert agree_on_flag(store, "b", 1, 0, [0, 1, 2], True, never, time.monotonic() + 5) is False


def test_a_member_known_failed_is_not_waited_for_and_a_silent_one_counts_as_no() -> None:
    store = dist.HashStore()
    store.set("k/agree1/yes/1", b"1")
    t0 = time.monotonic()
    assert agree_on_flag(store, "k", 1, 0, [0, 1, 2], True, lambda: {2}, t0 + 30) is True
    assert time.monotonic() - t0 < 5  # decided without waiting for the failed member
    # rank 2 is alive but never votes: at the deadline the answer is no, for everyone after too
    assert agree_on_flag(store, "s", 1, 0, [0, 1, 2], True, lambda: set(), time.monotonic() + 0.2) is False
    assert agree_on_flag(store, "s", 1, 1, [0, 1, 2], True, lambda: set(), time.monotonic() + 5) is False


def test_concurrent_voters_all_return_the_same_value() -> None:
    store = dist.HashStore()
    got: dict[int, bool] = {}
    flags = {0: True, 1: True, 2: False, 3: True}

    def vote(r: int) -> None:
        got[r] = agree_on_flag(store, "c", 1, r, list(flags), flags[r], lambda: set(), time.monotonic() + 10)

    threads = [threading.Thread(target=vote, args=(r,)) for r in flags]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert got == {r: False for r in flags}


class _Keys(dist.HashStore):
    """A HashStore that counts its keys and can hold the last member's count of its read of the
    decision (every member the decision is for counts its read, the proposer too; the store
    calls run on the agreement's helper thread, so the member is told by its place, not its
    thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: set[str] = set()
        self.hold_last_of: int | None = None  # readers of a decision: the last one's count waits
        self.release = threading.Event()
        self._add_lock = threading.Lock()

    def set(self, key, value):  # type: ignore[no-untyped-def]
        self.keys.add(key)
        return super().set(key, value)

    def add(self, key, n):  # type: ignore[no-untyped-def]
        if key.endswith("/read") and self.hold_last_of is not None:
            with self._add_lock:
                last = super().add(key, 0) == self.hold_last_of - 1
                if not last:
                    self.keys.add(key)
                    return super().add(key, n)
            self.release.wait(30)
        self.keys.add(key)
        return super().add(key, n)

    def compare_set(self, key, expected, desired):  # type: ignore[no-untyped-def]
        out = super().compare_set(key, expected, desired)
        if bytes(out) == bytes(desired):
            self.keys.add(key)
        return out

    def delete_key(self, key):  # type: ignore[no-untyped-def]
        self.keys.discard(key)
        return super().delete_key(key)



def _rounds(store: dist.Store, members: list[int], flags: dict[int, bool], rounds: int,
            failed: set[int] = frozenset(), names: str = "member") -> dict[int, list[bool]]:
    got: dict[int, list[bool]] = {r: [] for r in members}

    def run(r: int) -> None:
        for n in range(1, rounds + 1):
            got[r].append(agree_on_flag(store, "p", n, r, members, flags[r], lambda: set(failed),
                                        time.monotonic() + 20, poll_s=0.001))

    threads = [threading.Thread(target=run, args=(r,), name=f"{names}-{r}") for r in members if r not in failed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return got


@pytest.mark.parametrize("flags", [{0: True, 1: True, 2: True}, {0: True, 1: False, 2: True}])
def test_the_store_keeps_no_key_of_a_round_once_every_member_read_it(flags: dict[int, bool]) -> None:
    """After 25 agrees by 3 members the store holds one key of them all (the highest closed
    round); it used to keep 4 per round (3 votes and the decision), for the whole job."""
    store = _Keys()
    got = _rounds(store, [0, 1, 2], flags, 25)
    assert got == {r: [all(flags.values())] * 25 for r in flags}
    assert store.keys == {"p/agree/closed"}, sorted(store.keys)
    assert store.get("p/agree/closed") == b"25"


class _SilentOnDelete(dist.HashStore):
    """A HashStore whose ``delete_key`` is never answered (its host stalled as the round closes)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def delete_key(self, key):  # type: ignore[no-untyped-def]
        self.release.wait(30)
        return super().delete_key(key)


def test_a_round_whose_keys_the_store_does_not_delete_in_time_still_returns_its_decision() -> None:
    """The last reader deletes the round's keys after the decision: a store that did not answer
    that in time failed the whole agreement (seen: a shrink blamed its TCPStore's
    ``delete_key(.../read)`` instead of the dead member it waited for)."""
    store = _SilentOnDelete()
    store.set_timeout(timedelta(seconds=5))
    try:  # one member: it is the decision's last reader, which closes the round
        assert agree_on_flag(store, "d", 1, 0, [0], True, lambda: set(), time.monotonic() + 0.5) is True
        # the round is closed for later members, its keys still in the store
        assert store.check(["d/agree/closed", "d/agree1/decision"]) and store.get("d/agree/closed") == b"1"
    finally:
        store.release.set()


def test_a_slow_reader_still_reads_the_decision_and_the_keys_go_after_it() -> None:
    """The last of three members is held inside its read of the decision while the other two
    return: the round's keys stay until it has read it, then go."""
    store = _Keys()
    store.hold_last_of = 3
    got: dict[int, bool] = {}

    def run(r: int) -> None:
        got[r] = agree_on_flag(store, "p", 1, r, [0, 1, 2], True, lambda: set(), time.monotonic() + 20, poll_s=0.001)

    threads = {r: threading.Thread(target=run, args=(r,), name=f"slow-{r}") for r in (0, 1, 2)}
    for t in threads.values():
        t.start()
    deadline = time.monotonic() + 20
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(got) == 2 and all(got.values()), got
    assert "p/agree1/decision" in store.keys  # the last reader has not read it yet
    store.release.set()
    for t in threads.values():
        t.join(20)
    assert got == {0: True, 1: True, 2: True}
    assert store.keys == {"p/agree/closed"}, sorted(store.keys)


def test_a_member_the_round_was_not_decided_for_cannot_decide_it_again_after_it_closed() -> None:
    """0 and 1 hold 2 failed, decide and close round 1; 2 comes after and raises instead of
    finding no decision and deciding the round alone."""
    from torchcomms.recovery.agreement import RoundClosed

    store = _Keys()
    assert _rounds(store, [0, 1, 2], {0: True, 1: True, 2: True}, 1, failed={2}) == {0: [True], 1: [True], 2: []}
    assert store.keys == {"p/agree/closed"}
    with pytest.raises(RoundClosed):
        agree_on_flag(store, "p", 1, 2, [0, 1, 2], True, lambda: set(), time.monotonic() + 0.5)
    assert store.keys == {"p/agree/closed"}, sorted(store.keys)  # nothing of it is left either


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
