"""Calls that do not fit together raise typed errors on real gloo ranks; none aborts in C++."""
from __future__ import annotations

import pytest

from tests.helpers.ranks import RankGroup

WORKERS = "tests.torchcomms.mismatch_workers"


CHECK = {"TORCHCOMM_CHECK_COLLECTIVES": "1"}


def _run(n: int, target: str, kwargs: dict | None = None, timeout: float = 90, env: dict | None = None) -> list:
    with RankGroup(n, f"{WORKERS}:{target}", kwargs, env=env) as g:
        results = g.wait(timeout, failed_grace=20)
    for r in results:
        assert r.returncode == 0 and r.error is None, f"rank {r.rank}: rc={r.returncode} {r.error}\n{r.stderr[-2000:]}"
    return [r.value for r in results]


@pytest.mark.parametrize("sent,sent_dtype,expected,expected_dtype,words", [
    ([8], "float32", [4], "float32", "rank 0 sent 8 elements of torch.float32 but rank 1 posted a buffer for 4"),
    ([4], "float32", [8], "float32", "rank 0 sent 4 elements of torch.float32 but rank 1 posted a buffer for 8"),
    ([8], "float32", [8], "float64", "posted a buffer for 8 elements of torch.float64"),
    ([2, 4], "int32", [8], "float32", "rank 0 sent 8 elements of torch.int32"),
])
def test_p2p_mismatch_raises_on_the_receiver(sent, sent_dtype, expected, expected_dtype, words) -> None:
    sender, receiver = _run(2, "p2p", dict(sent=sent, sent_dtype=sent_dtype, expected=expected,
                                           expected_dtype=expected_dtype))
    assert sender == "ok"
    assert receiver.startswith("CollectiveMismatchError") and words in receiver, receiver


def test_p2p_mismatch_raises_on_both_sides_in_the_check_mode() -> None:
    sender, receiver = _run(2, "p2p", dict(sent=[8], sent_dtype="float32", expected=[4], expected_dtype="float32"),
                            env=CHECK)
    assert sender.startswith("CollectiveMismatchError") and "rank 1 posted a buffer for 4 elements" in sender, sender
    assert receiver.startswith("CollectiveMismatchError") and "rank 0 sent 8 elements" in receiver, receiver


@pytest.mark.parametrize("env", [None, CHECK], ids=["default", "check"])
def test_p2p_same_shape_different_view_is_fine(env) -> None:
    assert _run(2, "p2p", dict(sent=[2, 4], sent_dtype="float32", expected=[8], expected_dtype="float32"),
                env=env) == ["ok", "ok"]


@pytest.mark.parametrize("env", [None, CHECK], ids=["default", "check"])
def test_p2p_receives_from_one_peer_land_in_order(env) -> None:
    sizes = [3, 1, 5, 2, 7, 1, 4, 6, 2, 9]
    _, got = _run(2, "p2p_in_order", dict(sizes=sizes), env=env)
    assert got == [[float(i)] for i in range(len(sizes))] + [[float(10 + i)] for i in range(len(sizes))]


def test_inconsistent_split_lists_raise_on_every_rank() -> None:
    # rank 0 thinks it is alone; rank 1 thinks it is with rank 0; rank 2 stays out
    values = _run(3, "split_lists", dict(lists={"0": [0], "1": [0, 1], "2": []}))
    assert all(v.startswith("CollectiveMismatchError") for v in values), values
    assert len(set(values)) == 1, values  # the same verdict, naming the same ranks, everywhere


def test_consistent_split_lists_still_split() -> None:
    values = _run(3, "split_lists", dict(lists={"0": [0, 2], "1": [], "2": [0, 2]}))
    assert values == ["ok", "ok", "ok"], values


def test_local_argument_error_never_blames_its_peer() -> None:
    bad, peer = _run(2, "wrong_all_gather_size")
    assert bad.startswith("CommValueError") and "output must hold" in bad, bad
    assert peer.startswith("CommTimeoutError"), peer  # rank 0 did not fail: nobody is blamed
