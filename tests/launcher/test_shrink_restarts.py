"""``--on-failure shrink --max-restarts N``: a failed worker's process is started again (at most N
times per rank) while others run; healthy workers are never restarted."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from conftest import REPO, base_env, launcher_cmd, pid_alive, read_pids, run_launcher, wait_for, worker

from tests.helpers.cpu_load import oversubscribed


def test_a_failed_rank_is_restarted_up_to_max_restarts_and_healthy_ones_never(tmp_path):
    # rank 1 exits 3 at once in every life; rank 0 runs for 4 s and exits 0
    env = base_env(PID_DIR=str(tmp_path), EXIT_RANK="1", EXIT_CODE="3", SLEEP="4")
    proc = run_launcher("--nproc-per-node", "2", "--on-failure", "shrink", "--max-restarts", "1",
                        worker("sleeper.py"), env=env)
    restarts = [ln for ln in proc.stderr.splitlines() if " restarted (pid " in ln]
    assert len(restarts) == 1 and "rank 1 restarted" in restarts[0] and "restart 1 of 1" in restarts[0], \
        proc.stderr
    assert proc.stderr.count("failed (exit 3)") == 2, proc.stderr  # both lives of rank 1 failed
    assert proc.returncode == 0, proc.stderr  # tolerated: rank 0 ran on and succeeded
    table = [ln.split() for ln in proc.stderr.splitlines() if ln.startswith(("0 ", "1 "))]
    assert [row[0] for row in table] == ["0", "1", "1"], proc.stderr  # one row per process


def test_a_failed_ranks_process_group_is_ended_while_the_survivors_run(tmp_path):
    """Under shrink the job goes on after a rank failed; what the rank started in its process group
    (a helper, a data loader) is ended with it, not left running beside the survivors (and a
    replacement) until the job's end."""
    env = base_env(PID_DIR=str(tmp_path), EXIT_RANK="1", EXIT_CODE="3", CHILD_RANKS="1", SLEEP="600")
    agent = subprocess.Popen(launcher_cmd("--nproc-per-node", "2", "--on-failure", "shrink", worker("sleeper.py")),
                             env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    child = 0
    try:
        read_pids(tmp_path, 2)  # rank 1 wrote its child's pid before its own
        survivor = int((tmp_path / "0.pid").read_text())
        child = int((tmp_path / "1.child").read_text())
        ended = wait_for(lambda: not pid_alive(child), timeout=30)
        assert pid_alive(survivor)
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=60)
        assert ended, f"rank 1's child {child} ran on after rank 1 failed\n{out}"
        assert "rank 1 on" in out and "failed (exit 3)" in out, out
    finally:
        if agent.poll() is None:
            agent.kill()
        if child and pid_alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_replacement_of_a_hung_rank_is_not_killed_as_hung(tmp_path):
    """The hung verdict's SIGKILL deadline was kept per rank: the process started in a hung
    rank's place was SIGKILLed as soon as it ran (0.1 s), never judged itself."""
    env = base_env(PID_DIR=str(tmp_path), HUNG_ONCE="1")
    proc = run_launcher("--nproc-per-node", "2", "--on-failure", "shrink", "--max-restarts", "1",
                        "--hung-timeout", "2", "--grace-period", "1", worker("hung.py"), env=env)
    assert proc.stderr.count("is hung (no heartbeat") == 1, proc.stderr
    assert "rank 1 restarted" in proc.stderr and (tmp_path / "1.replaced").exists(), proc.stderr
    rows = [ln.split(None, 4)[4] for ln in proc.stderr.splitlines() if ln.startswith("1 ")]
    assert [r.split("  ")[0] for r in rows] == ["hung, SIGKILL", "exit 0"], proc.stderr
    assert proc.returncode == 0, proc.stderr


def test_without_max_restarts_shrink_restarts_nobody(tmp_path):
    env = base_env(PID_DIR=str(tmp_path), EXIT_RANK="1", EXIT_CODE="3", SLEEP="2")
    proc = run_launcher("--nproc-per-node", "2", "--on-failure", "shrink", worker("sleeper.py"), env=env)
    assert " restarted (pid " not in proc.stderr and proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("leave_by", ["os_exit", "sys_exit"])
def test_rank_leaving_with_exit_code_0_does_not_hold_the_survivors_shrink(leave_by: str):
    """A worker that exits 0 without finalizing (``os._exit``, or a normal exit with its
    communicator open) is gone for good: the survivors' ``agree`` and ``shrink`` leave it out
    instead of waiting for it until their timeout."""
    env = base_env(TORCHCOMM_TIMEOUT_SECONDS="60", TORCHCOMM_LOG_EVENTS="0", LEAVE_BY=leave_by)
    with oversubscribed(per_core=4, limit_s=240):  # the exit is seen on a busy CPU too
        proc = run_launcher("--nproc-per-node", "3", "--on-failure", "shrink",
                            worker("leaves_unclean.py"), env=env, timeout=240)
    for rank in (0, 2):
        assert f"rank {rank} done: world 2 last sum 2" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr
