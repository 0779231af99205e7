"""The MPI rank pool (``tests/helpers/mpi_pool.py``): tests of MPI targets run on jobs kept
between tests; each target must find its ranks as fresh ones, a target that fails or hangs must
fail its test as on a fresh job and leave the next request a fresh job, and no rank may outlive
the test process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import mpi_pool
from tests.helpers.mpi_ranks import mpi_available, process_running, run_mpi_ranks
from tests.helpers.paths import REPO, child_pythonpath
from tests.helpers.rank_state import LIBRARY_STATE, library_globals

pytestmark = pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")

W = "tests.mpi.pool_workers"


@pytest.fixture(autouse=True)
def _pool_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mpi_pool.POOL_ENV, raising=False)


def _pids(results) -> list[int]:
    return [r.value if isinstance(r.value, int) else r.value["pid"] for r in results]


def _wait_gone(pids: list[int], limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while any(process_running(p) for p in pids):
        assert time.monotonic() < deadline, f"ranks {[p for p in pids if process_running(p)]} still run"
        time.sleep(0.05)


def test_successive_targets_run_on_one_job_each_in_a_group_directory_of_its_own():
    first = run_mpi_ranks(2, f"{W}:describe")
    second = run_mpi_ranks(2, f"{W}:describe")
    assert _pids(first) == _pids(second)
    assert first[0].value["group_dir"] != second[0].value["group_dir"]
    assert all(r.value["fr_prefix_in_group_dir"] and r.value["sum"] == 2.0 for r in first + second)
    assert not os.path.exists(first[0].value["group_dir"])  # removed once its results were read


def test_a_target_finds_the_process_as_a_fresh_rank_does_whatever_the_one_before_changed():
    # Everything a target saw of an earlier one's process (environment, working directory,
    # torch's defaults and random state, signal handlers, its module's globals, the library's
    # names, op ids and flight recorder) must be as a fresh rank has it.
    fresh = [r.value for r in run_mpi_ranks(2, f"{W}:describe", pool=False)]
    marked = run_mpi_ranks(2, f"{W}:describe", {"leave_marks": True})
    after = run_mpi_ranks(2, f"{W}:describe")
    assert _pids(marked) == _pids(after)  # the same processes
    differ = ("pid", "group_dir", "random")  # a fresh process's torch generator has a seed of its own
    for want, got in zip(fresh, (r.value for r in after)):
        assert {k: v for k, v in got.items() if k not in differ} == {k: v for k, v in want.items() if k not in differ}
    assert (fresh[0]["random"] != fresh[1]["random"]) is (after[0].value["random"] != after[1].value["random"])
    # one target after another in a process draw as two fresh processes do (alike only if seeded alike)
    assert (fresh[0]["random"] != fresh[1]["random"]) is (marked[0].value["random"] != after[0].value["random"])


def test_every_process_global_of_the_library_is_known_to_the_pool():
    # A module-level registry or cache added to torchcomms would be seen by the next target of a
    # pool job: the pool must reset it, check it, or say why it may stay (rank_state.LIBRARY_STATE).
    assert sorted(library_globals()) == sorted(LIBRARY_STATE)


@pytest.mark.parametrize(("target", "named"), [("leave_a_communicator", "communicator 'left-open' is active"),
                                               ("leave_a_thread", "thread 'left-running' still running")])
def test_a_target_that_leaves_something_behind_ends_its_job_and_the_next_one_starts_fresh(target, named):
    before = _pids(run_mpi_ranks(2, f"{W}:pid"))
    results = run_mpi_ranks(2, f"{W}:{target}")
    assert _pids(results) == before
    assert any(named in what for what in results[0].extra["pool"]["leftovers"])
    _wait_gone(before)  # ended through the ranks' normal exit (its status checked, 0)
    assert set(_pids(run_mpi_ranks(2, f"{W}:pid"))).isdisjoint(before)


@pytest.mark.parametrize("pool", [False, True])
def test_a_target_whose_ranks_exit_badly_fails_as_on_a_fresh_job(pool):
    # The target registered an exit handler: the pool job ends after it through the ranks'
    # normal exit, whose status fails the test as a fresh job's does.
    with pytest.raises(AssertionError, match=r"Exit code:\s+3"):
        run_mpi_ranks(2, f"{W}:exit_with", {"code": 3}, pool=pool)


def test_a_failing_target_fails_its_test_with_every_ranks_error_and_the_next_request_gets_a_fresh_job():
    before = _pids(run_mpi_ranks(2, f"{W}:pid"))
    with pytest.raises(AssertionError) as info:
        run_mpi_ranks(2, f"{W}:fail_on", {"rank": 1})
    report = str(info.value)
    assert report.startswith("rank(s) 1 failed"), report
    assert "RuntimeError" in report and "rank 1 gave up in the pool" in report and "Traceback" in report
    _wait_gone(before)
    assert set(_pids(run_mpi_ranks(2, f"{W}:pid"))).isdisjoint(before)


def test_peers_of_a_failed_rank_are_given_a_grace_then_reported_with_their_stacks():
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as info:
        run_mpi_ranks(2, f"{W}:fail_on", {"rank": 0, "others_block": True}, timeout=120)
    assert time.monotonic() - t0 < 60
    report = str(info.value)
    assert report.startswith(f"rank(s) 0 failed; rank(s) 1 had not finished {mpi_pool.FAILED_GRACE_S:g} s later")
    assert "_blocked_in_a_pool_target" in report  # rank 1's stack, dumped before it was killed


def test_a_hung_target_is_killed_at_its_timeout_and_the_next_request_works():
    before = _pids(run_mpi_ranks(2, f"{W}:pid"))
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as info:
        run_mpi_ranks(2, f"{W}:hang", timeout=4)
    assert time.monotonic() - t0 < 4 + 15
    report = str(info.value)
    assert report.startswith("the MPI job did not finish within 4 s"), report
    assert "_blocked_in_a_pool_target" in report
    _wait_gone(before, 5)
    assert set(_pids(run_mpi_ranks(2, f"{W}:pid"))).isdisjoint(before)


def test_ranks_run_on_the_cpus_of_the_thread_that_asked_as_a_fresh_jobs_would():
    # A job's processes inherit the CPUs of the thread that starts it; a test confined to some
    # (cpu_load.oversubscribed) must get ranks confined alike, not the pool's job from before.
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs")
    assert [r.value for r in run_mpi_ranks(2, f"{W}:cpus")] == [allowed] * 2
    os.sched_setaffinity(0, {allowed[-1]})
    try:
        assert [r.value for r in run_mpi_ranks(2, f"{W}:cpus")] == [[allowed[-1]]] * 2
    finally:
        os.sched_setaffinity(0, allowed)
    assert [r.value for r in run_mpi_ranks(2, f"{W}:cpus")] == [allowed] * 2


def test_the_switch_turns_the_pool_off(monkeypatch):
    monkeypatch.setenv(mpi_pool.POOL_ENV, "0")
    pools = mpi_pool.pool_pids()
    first, second = (_pids(run_mpi_ranks(2, f"{W}:pid")) for _ in range(2))
    assert set(first).isdisjoint(second)
    assert mpi_pool.pool_pids() == pools


_OWNER = (
    "import json, os, sys\n"
    "from tests.helpers.mpi_ranks import run_mpi_ranks\n"
    "from tests.helpers import mpi_pool\n"
    "pids = [r.value for r in run_mpi_ranks(2, 'tests.mpi.pool_workers:pid')]\n"
    "(d,) = [str(p.dir) for p in mpi_pool._POOLS.values()]\n"
    "print(json.dumps({'pids': pids, 'dir': d}), flush=True)\n"
    "if sys.argv[1] == 'wait':\n"
    "    sys.stdin.readline()\n"
)


@pytest.mark.parametrize("how", ["exits", "is-killed"])
def test_a_pool_job_never_outlives_the_process_that_started_it(how):
    env = {k: v for k, v in os.environ.items() if k != mpi_pool.POOL_ENV}
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, "wait" if how == "is-killed" else "exit"], cwd=REPO,
                             env={**env, "PYTHONPATH": child_pythonpath()}, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(owner.stdout.readline())
        if how == "is-killed":
            owner.send_signal(signal.SIGKILL)
        assert owner.wait(60) == (-signal.SIGKILL if how == "is-killed" else 0)
    finally:
        if owner.poll() is None:
            owner.kill()
    _wait_gone(started["pids"])
    deadline = time.monotonic() + 30
    while os.path.exists(started["dir"]):
        assert time.monotonic() < deadline, "the pool job's directory was left behind"
        time.sleep(0.05)
