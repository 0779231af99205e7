"""The synchronous fast path: a blocking op waits in the engine on the caller's thread (as c10d
does), in slices, and still ends as soon as something else ends it."""
from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest

from tests.helpers.ranks import REPO, RankGroup
from torchcomms.backends.base import ENGINE_WAIT_SLICE_S
from torchcomms.backends.gloo import _engine_wait


class _SliceRace:
    """A c10d work that completes just after a timed wait gave up: ``wait(timeout)`` raises
    c10d's "Operation timed out!" but ``is_completed()`` is already True."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.plain_waits = 0

    def wait(self, timeout: timedelta | None = None) -> bool:
        if timeout is not None:
            raise RuntimeError("Operation timed out!")
        self.plain_waits += 1
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return True


class _Running:
    def wait(self, timeout: timedelta | None = None) -> bool:
        assert timeout is not None and timeout.total_seconds() >= 0.001  # 0 ms would mean "forever" to c10d
        raise RuntimeError("Operation timed out!")

    def is_completed(self) -> bool:
        return False


def test_an_op_that_completes_as_the_slice_runs_out_succeeds() -> None:
    # Regression: the slice's "Operation timed out!" was re-raised as the op's own error and
    # became a CommTimeoutError (seen in comm_bench at 16 MiB).
    work = _SliceRace()
    assert _engine_wait(work)(0.02) is True  # type: ignore[arg-type]
    assert work.plain_waits == 1


def test_an_op_that_failed_as_the_slice_ran_out_raises_its_own_error() -> None:
    work = _SliceRace(RuntimeError("Connection reset by peer"))
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        _engine_wait(work)(0.02)  # type: ignore[arg-type]


def test_a_running_op_reports_not_done_and_never_waits_forever() -> None:
    assert _engine_wait(_Running())(0.0) is False  # type: ignore[arg-type]


def test_a_blocked_sync_op_ends_when_the_control_plane_reports_the_peer() -> None:
    """Rank 1 is stopped: gloo sees nothing (its sockets stay open), so only the control
    plane's heartbeat verdict can end rank 0's synchronous all_reduce before its 120 s timeout.
    The caller is blocked in the engine, and must notice between slices."""
    tmp = Path(tempfile.mkdtemp(prefix="tc-syncstop-"))
    secret = tmp / "secret"
    server = subprocess.Popen([sys.executable, "-m", "torchcomms.control", "--new-secret-file", str(secret)],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert server.stdout is not None
        addr = server.stdout.readline().decode().strip()
        env = {"TORCHCOMM_CONTROL_ADDR": addr, "TORCHCOMM_CONTROL_SECRET_FILE": str(secret),
               "TC_READY_DIR": str(tmp), "TORCHCOMM_TRACING_DISABLE": "1"}
        with RankGroup(2, "tests.torchcomms.workers:sync_op_with_stopped_peer", env=env) as g:
            g.wait_ready(tmp)
            g.signal(1, signal.SIGSTOP)
            (tmp / "go").touch()
            res = g.wait(timeout=100, ranks=[0])[0]
    finally:
        server.kill()
    assert res.value is not None, res.stderr[-2000:]
    assert res.value["raised"] == "PeerFailureError", res.value
    assert res.value["failed_ranks"] == [1] and res.value["detected_by"] == "heartbeat", res.value
    assert res.value["elapsed"] < 60, res.value  # ended by the verdict, far from the 120 s timeout


def test_abort_from_another_thread_ends_a_sync_op_blocked_in_the_engine() -> None:
    with RankGroup(2, "tests.torchcomms.workers:sync_op_aborted_from_another_thread") as g:
        res = g.wait(timeout=100, ranks=[0])[0]
    assert res.value is not None, res.stderr[-2000:]
    assert res.value["raised"] == "CommAbortedError", res.value
    assert "aborted" in res.value["message"], res.value
    assert res.value["elapsed"] < 60, res.value  # ended by the abort, far from the 120 s timeout


def test_sync_ops_enter_the_watchdog_table_only_when_they_outlast_the_first_slice() -> None:
    with RankGroup(2, "tests.torchcomms.workers:sync_ops_and_the_watchdog_table",
                   env={"TORCHCOMM_TRACING_DISABLE": "1"}) as g:
        results = g.wait(timeout=100)
    for res in results:
        assert res.value is not None, res.stderr[-2000:]
        quick = res.value["quick"]
        # an op waits one slice before it is entered; on a loaded host a few quick ones may be
        assert all(seconds >= ENGINE_WAIT_SLICE_S for tracked, seconds in quick if tracked), quick
        assert sum(not tracked for tracked, _ in quick) >= len(quick) // 2, quick
        assert res.value["sum"] == 2.0 ** 51, res.value  # 51 all_reduces of ones over 2 ranks
    # rank 0 waited 2 s for rank 1: its op was in the table when sampled 1 s in, and left it
    assert results[0].value["slow"] == {"tracked": True, "in_table_while_blocked": 1, "in_table_after": 0}, \
        results[0].value


@pytest.mark.parametrize("peer_joins", [True, False], ids=["peer-joins", "peer-never-joins"])
def test_finalize_waits_for_a_sync_op_that_is_still_in_its_first_slice(peer_joins: bool) -> None:
    with RankGroup(2, "tests.torchcomms.workers:finalize_during_a_sync_op_in_its_first_slice", {"peer_joins": peer_joins},
                   env={"TORCHCOMM_TRACING_DISABLE": "1"}) as g:
        res = g.wait(timeout=60, ranks=[0])[0]
    assert res.value is not None, res.stderr[-2000:]
    got = {k: res.value[k] for k in ("op", "sum", "finalize_returned")}
    want = {"op": "completed", "sum": 2.0} if peer_joins else {"op": "CommTimeoutError", "sum": 1.0}
    assert got == {**want, "finalize_returned": True}, res.value


def test_a_peer_failure_fails_a_sync_op_in_its_first_slice_at_once() -> None:
    with RankGroup(2, "tests.torchcomms.workers:peer_failure_during_a_sync_op_in_its_first_slice",
                   env={"TORCHCOMM_TRACING_DISABLE": "1"}) as g:
        res = g.wait(timeout=60, ranks=[0])[0]
    assert res.value is not None, res.stderr[-2000:]
    assert res.value["raised"] == "PeerFailureError", res.value
    assert res.value["state_at_0.6s"] == "failed", res.value  # failed by the notice, before its slice ended
    assert res.value["in_table"] == 0, res.value
