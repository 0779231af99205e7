"""The multi-process test runner: a rank that outlives its timeout is reported with every
rank's state and the hung rank's stacks (before, the report named only the rank)."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from tests.helpers.paths import REPO, child_pythonpath
from tests.helpers.ranks import RankGroup, run_ranks
from tests.helpers.zygote import FORK_RANKS_ENV, fork_ranks_enabled


def test_a_hung_rank_is_reported_with_its_stack_and_the_other_ranks_state():
    with pytest.raises(AssertionError) as info:
        run_ranks(2, "tests.helpers.sleepers:rank0_returns_others_block", timeout=3)
    report = str(info.value)
    assert "rank 1 did not finish within 3 s" in report
    assert "--- rank 0: exited rc=0" in report
    assert "--- rank 1: still running" in report
    assert "_blocked_forever" in report  # the hung rank's stack, dumped before it was killed


def test_a_failed_rank_is_named_first_and_its_waiting_peers_are_not_waited_on_for_long():
    # A rank blocked on a failed peer used to be waited on for the whole timeout, and the report
    # then named the waiting rank ("rank 1 did not finish within 180 s"), not the one that failed.
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as info:
        run_ranks(2, "tests.helpers.sleepers:rank0_raises_others_block", timeout=120, failed_grace=2)
    assert time.monotonic() - t0 < 60
    report = str(info.value)
    assert report.startswith("rank 0 failed (rc=1: RuntimeError: rank 0 gave up); rank(s) 1 had not finished 2 s later")
    assert "--- rank 1: still running" in report
    assert "_blocked_forever" in report


def test_ranks_keep_the_parents_python_path(tmp_path, monkeypatch):
    # The runner used to set PYTHONPATH to the repository alone, so every rank on the GPU
    # machine, whose dependencies sit on PYTHONPATH (carried wheels), failed to import them.
    (tmp_path / "tc_only_on_parent_path.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    results = run_ranks(2, "tests.helpers.sleepers:imports_from_pythonpath",
                        {"module": "tc_only_on_parent_path"}, timeout=60)
    assert [r.value for r in results] == [str(tmp_path / "tc_only_on_parent_path.py")] * 2


@pytest.mark.parametrize("route", ["0", "1"])
def test_forked_ranks_are_their_own_sessions_with_their_own_environment(route):
    # Ranks are forked from a process that imported torch already; torch reads some variables
    # only at import (TORCH_DISTRIBUTED_USE_TORCHCOMMS), so a rank whose environment differs in
    # one of those must come from a zygote that imported torch under that environment. A fork
    # that reset SIGPIPE to its default killed a rank writing to a closed socket (rc -13).
    results = run_ranks(2, "tests.helpers.sleepers:describe_process", timeout=60,
                        env={"TORCH_DISTRIBUTED_USE_TORCHCOMMS": route})
    for r in results:
        v = r.value
        assert v["session"] == v["pid"] and v["rank"] == str(r.rank)
        assert v["route_env"] == route and v["route_on"] == (route == "1")
        assert v["sigpipe_ignored"]


@pytest.mark.parametrize("preload", [False, True])
def test_a_preloaded_target_module_was_imported_before_the_fork_and_only_then(preload):
    if preload and not fork_ranks_enabled():
        pytest.skip(f"{FORK_RANKS_ENV}=0: every rank is a fresh interpreter")
    results = run_ranks(2, "tests.helpers.sleepers:importer", timeout=60, preload_target=preload)
    importers = {r.value["imported_by"] for r in results}
    if preload:  # imported once, by the zygote the ranks were forked from
        assert len(importers) == 1 and importers.isdisjoint(r.value["pid"] for r in results), results
    else:
        assert all(r.value["imported_by"] == r.value["pid"] for r in results), results


def test_a_forked_rank_killed_by_a_signal_reports_it_as_subprocess_does():
    with RankGroup(1, "tests.helpers.sleepers:kills_itself") as group:
        (res,) = group.wait(60)
    assert res.returncode == -signal.SIGKILL and res.value is None


def test_a_forked_rank_keeps_its_pid_until_its_exit_code_was_read():
    # The zygote reaped its children at once, so a rank's pid was free for reuse while the test
    # still held it: a later signal by pid (kill_all, a chaos kill) could reach whatever process
    # took it over. Like a Popen child, it now stays a zombie until its code has been read.
    with RankGroup(1, "tests.helpers.sleepers:kills_itself") as group:
        (proc,) = group.procs
        zygote = getattr(proc, "_zygote", None)
        if zygote is None:
            pytest.skip("ranks are not forked (TC_TEST_FORK_RANKS=0)")
        deadline = time.monotonic() + 60
        while zygote.exit_code(proc.pid) is None:  # ended, not yet read by the group
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with open(f"/proc/{proc.pid}/stat") as f:
            assert f.read().rpartition(")")[2].split()[0] == "Z"
        assert proc.poll() == -signal.SIGKILL  # read: the zygote may reap it now
        while os.path.exists(f"/proc/{proc.pid}"):
            assert time.monotonic() < deadline
            time.sleep(0.02)



def test_a_forked_rank_that_got_an_earlier_ranks_pid_is_not_taken_for_that_rank(tmp_path):
    # The test side kept each child's exit code by pid after the zygote had reaped it: a later
    # child given the same pid (pids wrap around in a long suite) was reported ended, with the
    # earlier child's code, from its start (a suite run saw a live rank 0 as "killed by SIGKILL").
    # The next pid is chosen through ns_last_pid; other processes forking meanwhile may take it
    # first, so the test tries until the zygote's fork gets it.
    if not fork_ranks_enabled():
        pytest.skip("ranks are not forked (TC_TEST_FORK_RANKS=0)")
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("choosing the next pid needs root (/proc/sys/kernel/ns_last_pid)")
    with RankGroup(1, "tests.helpers.sleepers:kills_itself") as group:
        (first,) = group.procs
        assert first.wait(60) == -signal.SIGKILL
        zygote = first._zygote
        env = dict(os.environ, PYTHONPATH=child_pythonpath())
        for attempt in range(200):
            release = tmp_path / f"release{attempt}"
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(first.pid - 1))
            later = zygote.fork(env, REPO, tmp_path / f"log{attempt}", "tests.helpers.sleepers:waits_for_file",
                                json.dumps({"path": str(release)}), tmp_path / f"out{attempt}.json")
            if later.pid == first.pid:
                break
            release.touch()
            assert later.wait(60) == 0
        else:
            pytest.skip("other processes took the pid first in 200 tries")
        assert later.poll() is None  # it waits for its file
        release.touch()
        assert later.wait(60) == 0
        assert first.returncode == -signal.SIGKILL


_CLAIM_ONE_CPU = (
    "import os, sys, time\n"
    "from tests.helpers.cpu_load import oversubscribed\n"
    "with oversubscribed(per_core=1, limit_s=60):\n"
    "    print(sorted(os.sched_getaffinity(0))[0], flush=True)\n"
    "    sys.stdin.readline()\n"
)


@pytest.mark.parametrize("fork", ["1", "0"])
def test_an_oversubscribed_block_confines_its_ranks_and_busy_loops_to_a_cpu_no_other_block_holds(fork, monkeypatch,
                                                                                                  tmp_path):
    # Every block ran its busy loops on every CPU: blocks of several pytest workers stacked (a
    # load of 165 on the 16-CPU GPU host) and starved every test beside them. A block now runs
    # on CPUs of its own, and its ranks, forked or not, run there too.
    import subprocess
    import sys

    from tests.helpers.cpu_load import CLAIMS_DIR_ENV, oversubscribed
    from tests.helpers.paths import REPO, child_pythonpath

    monkeypatch.setenv("TC_TEST_FORK_RANKS", fork)
    monkeypatch.setenv(CLAIMS_DIR_ENV, str(tmp_path))  # claims of its own: blocks of other workers share a busy CPU
    allowed = sorted(os.sched_getaffinity(0))
    other = None
    if len(allowed) >= 2:  # a block held by another process: this one must take another CPU
        other = subprocess.Popen([sys.executable, "-c", _CLAIM_ONE_CPU], cwd=REPO, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=child_pythonpath()))
    try:
        taken = int(other.stdout.readline()) if other is not None else None
        release = threading.Event()
        started_inside = threading.Thread(target=release.wait, daemon=True)
        with oversubscribed(per_core=2, limit_s=60) as loops:
            mine = sorted(os.sched_getaffinity(0))
            results = run_ranks(2, "tests.helpers.sleepers:describe_process", timeout=60)
            started_inside.start()
        assert loops == 2 and len(mine) == 1 and mine[0] in allowed and mine[0] != taken
        assert [r.value["cpus"] for r in results] == [mine, mine]
        # given back when the block ended, also to a thread started in it (which inherited the
        # block's CPU: torch's intra-op pool started there stayed on it for the worker's later tests)
        assert sorted(os.sched_getaffinity(0)) == allowed
        assert sorted(os.sched_getaffinity(started_inside.native_id)) == allowed
        release.set()
    finally:
        if other is not None:
            other.communicate("\n", timeout=60)


@pytest.mark.parametrize("given", [None, "2"])
def test_ranks_take_one_intra_op_thread_each_unless_the_environment_says(given, monkeypatch):
    # With torch's default of a thread per core, the ranks of a test and pytest's workers
    # oversubscribed the cores and spun waiting for each other (tests/fsdp2/test_fsdp2_ranks.py:
    # 130-141 s on the 2-core VM, 79-86 s with one thread each); the launcher gives its workers
    # one thread each for the same reason.
    if given is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", given)
    results = run_ranks(2, "tests.helpers.sleepers:intra_op_threads", timeout=60)
    assert [r.value for r in results] == [int(given or 1)] * 2
