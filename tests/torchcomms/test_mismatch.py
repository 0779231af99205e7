"""Calls that do not fit together raise typed errors on real ranks (gloo; the point-to-point
cases on each engine, through the ``launch`` fixture); none aborts in C++."""
from __future__ import annotations

import re

import pytest

from tests.helpers.ranks import RankGroup
from tests.torchcomms.conftest import Launch

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
    # past MPI's eager size: a longer message is never received into a buffer it does not fit
    # (gloo aborts the process; Open MPI writes past the buffer, then reports MPI_ERR_TRUNCATE)
    ([40000], "float32", [20000], "float32", "rank 0 sent 40000 elements of torch.float32 but rank 1 posted a buffer for 20000"),
    ([8], "float32", [40000], "float32", "rank 0 sent 8 elements of torch.float32 but rank 1 posted a buffer for 40000"),
    ([20000], "float32", [20000], "float64", "posted a buffer for 20000 elements of torch.float64"),
])
def test_p2p_mismatch_raises_on_the_receiver(sent, sent_dtype, expected, expected_dtype, words,
                                             launch: Launch) -> None:
    sender, receiver = [r.value for r in launch(2, f"{WORKERS}:p2p", dict(
        sent=sent, sent_dtype=sent_dtype, expected=expected, expected_dtype=expected_dtype))]
    assert sender == "ok"
    assert receiver.startswith("CollectiveMismatchError") and words in receiver, receiver
    assert "[comm 'mm', recv #1]" in receiver, receiver  # where, as every error of an op says


def test_p2p_mismatch_raises_on_both_sides_in_the_check_mode() -> None:
    sender, receiver = _run(2, "p2p", dict(sent=[8], sent_dtype="float32", expected=[4], expected_dtype="float32"),
                            env=CHECK)
    assert sender.startswith("CollectiveMismatchError") and "rank 1 posted a buffer for 4 elements" in sender, sender
    assert receiver.startswith("CollectiveMismatchError") and "rank 0 sent 8 elements" in receiver, receiver
    assert "[comm 'mm', send #1]" in sender and "[comm 'mm', recv #1]" in receiver, (sender, receiver)


@pytest.mark.parametrize("env", [None, CHECK], ids=["default", "check"])
def test_p2p_same_shape_different_view_is_fine(env) -> None:
    assert _run(2, "p2p", dict(sent=[2, 4], sent_dtype="float32", expected=[8], expected_dtype="float32"),
                env=env) == ["ok", "ok"]


def test_p2p_same_shape_different_view_is_fine_on_each_engine(launch: Launch) -> None:
    assert [r.value for r in launch(2, f"{WORKERS}:p2p", dict(sent=[2, 4], sent_dtype="float32", expected=[8],
                                                             expected_dtype="float32"))] == ["ok", "ok"]


SIZES = [3, 1, 5, 2, 7, 1, 4, 6, 2, 9]
IN_ORDER = [[float(i)] for i in range(len(SIZES))] + [[float(10 + i)] for i in range(len(SIZES))]
# float32 counts above MPI's eager size (a few KiB) among small ones
LARGE_SIZES = [3, 16384, 1, 40000, 2]


@pytest.mark.parametrize("env", [None, CHECK], ids=["default", "check"])
def test_p2p_receives_from_one_peer_land_in_order(env) -> None:
    _, got = _run(2, "p2p_in_order", dict(sizes=SIZES), env=env)
    assert got == IN_ORDER


@pytest.mark.parametrize("sizes", [SIZES, LARGE_SIZES], ids=["small", "large"])
def test_p2p_receives_from_one_peer_land_in_order_on_each_engine(sizes: list[int], launch: Launch) -> None:
    _, got = [r.value for r in launch(2, f"{WORKERS}:p2p_in_order", dict(sizes=sizes))]
    assert got == [[float(i)] for i in range(len(sizes))] + [[float(10 + i)] for i in range(len(sizes))]


def test_inconsistent_split_lists_raise_on_every_rank() -> None:
    # rank 0 thinks it is alone; rank 1 thinks it is with rank 0; rank 2 stays out
    values = _run(3, "split_lists", dict(lists={"0": [0], "1": [0, 1], "2": []}))
    assert all(v.startswith("CollectiveMismatchError") for v in values), values
    assert len(set(values)) == 1, values  # the same verdict, naming the same ranks, everywhere


def test_consistent_split_lists_still_split() -> None:
    values = _run(3, "split_lists", dict(lists={"0": [0, 2], "1": [], "2": [0, 2]}))
    assert values == ["ok", "ok", "ok"], values


@pytest.mark.parametrize("modes,per_rank_env,words", [
    (["1", "0", "1"], {}, "on at ranks 0,2, off at rank 1"),
    (["", ""], {1: CHECK}, "on at rank 1, off at rank 0"),
], ids=["hint", "environment"])
def test_ranks_that_disagree_on_the_check_mode_are_refused_at_creation(modes, per_rank_env, words) -> None:
    """Before, the checking ranks waited for the others at their side engine and the others in
    the engine until the first op's deadline, both blaming the store or nobody."""
    with RankGroup(len(modes), f"{WORKERS}:check_modes", dict(modes=modes), per_rank_env=per_rank_env) as g:
        values = [r.value for r in g.wait(60, failed_grace=20)]
    every = "\n".join(f"rank {r}: {v}" for r, v in enumerate(values))  # whole, as pytest shortens a list
    assert all(v.startswith("CommValueError") and "[comm 'mm', new_comm]" in v and words in v for v in values), every
    assert len(set(values)) == 1, every  # the same verdict everywhere


def test_local_argument_error_never_blames_its_peer() -> None:
    bad, peer = _run(2, "wrong_all_gather_size")
    assert bad.startswith("CommValueError") and "output must hold" in bad, bad
    assert peer.startswith("CommTimeoutError"), peer  # rank 0 did not fail: nobody is blamed


@pytest.mark.parametrize("sent,expected,words", [
    ([4, 3], [4, 5], "rank 0 sent 3 elements of torch.float32 but rank 1 posted a buffer for 5"),
    ([4, 3], [4, 2], "rank 0 sent 3 elements of torch.float32 but rank 1 posted a buffer for 2"),
], ids=["shorter", "longer"])
def test_batch_p2p_mismatch_raises_on_the_receiver(sent, expected, words, launch: Launch) -> None:
    sender, receiver = [r.value for r in launch(2, f"{WORKERS}:batch_p2p", dict(sent=sent, expected=expected))]
    assert sender == "ok"
    assert receiver.startswith("CollectiveMismatchError") and words in receiver, receiver
    assert "[comm 'mm', batch_p2p #1]" in receiver, receiver


@pytest.mark.parametrize("sent,expected", [(3, 5), (5, 3)], ids=["shorter", "longer"])
def test_recv_any_source_mismatch_raises_on_the_receiver(sent, expected, launch: Launch) -> None:
    receiver, sender = [r.value for r in launch(2, f"{WORKERS}:recv_any_source", dict(sent=sent, expected=expected))]
    assert sender == "ok"
    words = f"rank 1 sent {sent} elements of torch.float32 but rank 0 posted a buffer for {expected}"
    assert receiver.startswith("CollectiveMismatchError") and words in receiver, receiver


def test_mpi_collective_whose_message_does_not_fit_raises_a_mismatch_not_a_backend_error() -> None:
    """Small enough for MPI's eager path (above it Open MPI writes past the buffer first: the
    message says so, and only the check mode avoids it)."""
    pytest.importorskip("mpi4py")
    from tests.helpers.mpi_ranks import run_mpi_ranks

    short, long = [r.value for r in run_mpi_ranks(2, f"{WORKERS}:all_reduce_sizes", dict(sizes=[4, 8]))]
    # the rank with the smaller buffer receives the longer message
    assert short.startswith("CollectiveMismatchError") and "longer than this rank's buffer" in short, short
    assert "TORCHCOMM_CHECK_COLLECTIVES=1" in short, short
    assert long.startswith(("CommTimeoutError", "CollectiveMismatchError")), long


def test_sync_reduce_scatter_whose_peer_never_comes_ends_at_its_deadline() -> None:
    """gloo's reduce-scatter work ignores the timeout of a timed wait: the op blocked until its
    peer left (here, the peer waits for the op's outcome: both waited until the peer gave up)."""
    waiting, peer = _run(2, "skipped_reduce_scatter")
    assert waiting.startswith("CommTimeoutError") and "reduce_scatter_single #2" in waiting, waiting
    assert peer == "ok"


#: each gloo collective: the rank whose tensors have twice the elements of the other's (the other
#: rank then receives a message longer than its buffer; for gather, the root does)
SIZE_MISMATCHES = {op: 0 for op in ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_single",
                                     "all_gather_v", "reduce_scatter", "reduce_scatter_single", "all_to_all_single",
                                     "all_to_all", "scatter")} | {"gather": 1}


@pytest.fixture(scope="module")
def gloo_size_mismatches() -> list:
    """One job of 2 ranks that calls every collective of ``SIZE_MISMATCHES``, each on a communicator of its own."""
    ops = SIZE_MISMATCHES | {"all_reduce_then_send": 0, "all_reduce_then_exit": 0}
    with RankGroup(2, f"{WORKERS}:collective_sizes", dict(ops=ops)) as g:
        return g.wait(120, failed_grace=20)


@pytest.mark.parametrize("op", SIZE_MISMATCHES)
def test_gloo_collective_with_mismatched_sizes_raises_on_every_rank(op: str, gloo_size_mismatches: list) -> None:
    """Before, gloo aborted the receiving process in C++ (terminate called after throwing
    gloo::EnforceNotMet: "Received data size doesn't match expected size"). The receiver now
    raises CollectiveMismatchError naming the sizes; its peer raises a CommError in the op, or,
    where its own part of the op was complete, in its next op on that communicator."""
    for r in gloo_size_mismatches:
        assert r.returncode == 0 and r.error is None, f"rank {r.rank}: rc={r.returncode} {r.error}\n{r.stderr[-2000:]}"
        assert "terminate called" not in r.stderr, r.stderr[-2000:]
    sender, receiver = SIZE_MISMATCHES[op], 1 - SIZE_MISMATCHES[op]
    got, _ = gloo_size_mismatches[receiver].value[op]
    assert got.startswith("CollectiveMismatchError") and f"[comm 'mm_{op}', {op} #" in got, got
    sizes = re.search(r"received a message of (\d+) bytes for a buffer of (\d+)", got)
    assert sizes is not None and int(sizes[1]) == 2 * int(sizes[2]), got
    sent, after = gloo_size_mismatches[sender].value[op]
    errors = ("PeerFailureError", "CollectiveMismatchError", "CommAbortedError")
    assert sent.startswith(errors) or (sent == "ok" and after.startswith(errors)), (sent, after)



def test_gloo_send_on_an_engine_stuck_by_a_mismatch_raises_at_once(gloo_size_mismatches: list) -> None:
    """The network thread that met the longer message holds its connection's lock: a send to
    that peer, posted on the caller's thread, waited for it for ever (the async all_reduce had
    not broken the communicator yet)."""
    got, _ = gloo_size_mismatches[1].value["all_reduce_then_send"]
    assert got.startswith("CollectiveMismatchError") and "[comm 'mm_all_reduce_then_send', send #" in got, got
    assert "received a message of" in got, got


def test_gloo_engine_stuck_by_a_mismatch_is_let_go_at_exit(gloo_size_mismatches: list) -> None:
    """The release at the interpreter's exit dropped the broken engine (no op of it was pending):
    its destructor waited for ever for the connection lock the parked network thread holds, so
    the rank never exited (the fixture's job did not end)."""
    got, _ = gloo_size_mismatches[1].value["all_reduce_then_exit"]
    assert got.startswith("CollectiveMismatchError"), got
