"""A stopped or killed rank: every other rank raises a typed error within timeout + 2 s, and the
broken communicator fails fast afterwards. No process is left behind."""
from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.ranks import RankGroup, run_ranks

TIMEOUT_S = 3.0


def _run_stall(world: int, victim: int, sig: int, op: str) -> list:
    ready = Path(tempfile.mkdtemp(prefix="tc-ready-"))
    with RankGroup(world, "tests.torchcomms.workers:stalled_peer",
                   {"op": op, "timeout_s": TIMEOUT_S, "victim": victim},
                   env={"TC_READY_DIR": str(ready)}) as g:
        g.wait_ready(ready)
        g.signal(victim, sig)
        time.sleep(0.2)
        (ready / "go").touch()
        survivors = [r for r in range(world) if r != victim]
        results = g.wait(timeout=TIMEOUT_S + 60, ranks=survivors)
        pids = g.pids
    for pid in pids:  # none left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    return results


@pytest.mark.parametrize("op", ["all_reduce", "barrier", "all_gather_single"])
def test_sigstop_peer_times_out_everyone(op: str) -> None:
    results = _run_stall(3, victim=2, sig=signal.SIGSTOP, op=op)
    for res in results:
        v = res.value
        assert v is not None, res.stderr[-2000:]
        assert v["raised"] == "CommTimeoutError", v
        assert v["op"] == op and v["seq"] == 2, v
        assert f"{op} #2" in v["message"] and "comm 'stall'" in v["message"]
        assert v["elapsed"] <= TIMEOUT_S + 2.0, v
        assert v["elapsed"] >= TIMEOUT_S - 0.5, v
        assert v["after"] == "CommAbortedError"
        assert v["after_elapsed"] < 1.0


def test_sigkill_peer_raises_within_timeout() -> None:
    results = _run_stall(3, victim=1, sig=signal.SIGKILL, op="all_reduce")
    for res in results:
        v = res.value
        assert v is not None, res.stderr[-2000:]
        assert v["raised"] in ("PeerFailureError", "CommTimeoutError"), v
        assert v["elapsed"] <= TIMEOUT_S + 2.0, v
        assert v["after"] == "CommAbortedError"
    # the killed rank's ring neighbours see the closed connection: a PeerFailureError
    assert any(res.value["raised"] == "PeerFailureError" for res in results)


def test_split_is_bounded_by_its_timeout_when_a_member_never_builds_the_new_engine() -> None:
    """A member stalls between the split's exchange and the new engine's rendezvous: the other
    member's split raises CommTimeoutError within the split's timeout (it used to wait for the
    communicator's timeout, 60 s here, and then raise the engine's untyped DistStoreError)."""
    with RankGroup(2, "tests.torchcomms.workers:split_with_member_stalled_before_its_engine",
                   {"split_timeout_s": 2.0}) as g:
        res = g.wait(timeout=90, ranks=[0])[0]
    assert res.ok(), res.stderr[-3000:]
    v = res.value
    assert v["raised"] == "CommTimeoutError" and v["is_comm_error"] and v["op"] == "split", v
    assert v["elapsed"] < 2.0 + 3.0, v
    assert v["name_free"], v



@pytest.mark.parametrize("after_shrink", [False, True], ids=["op-timeout-longer", "after-a-short-shrink"])
def test_an_op_is_ended_by_its_own_deadline_not_by_the_timeout_its_engine_was_built_with(after_shrink: bool) -> None:
    """gloo's engine took its op timeout from how it was built: the communicator's timeout when
    created, what was left of the shrink after a shrink. An op with a longer timeout of its own,
    or any op after a short shrink, failed early as a gloo timeout."""
    results = run_ranks(2, "tests.torchcomms.workers:op_outlasting_the_engine_timeout",
                        {"late_s": 4.0, "after_shrink": after_shrink}, timeout=120)
    assert [res.value for res in results] == ["sum=3", "sum=3"]
