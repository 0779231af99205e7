"""A group restarted by ``--on-failure restart`` meets in a store without the previous
attempt's keys (as under torchrun, whose store is hosted anew by each attempt's rank 0)."""

from __future__ import annotations

from conftest import base_env, run_launcher, worker


def test_restarted_group_does_not_read_the_previous_attempts_keys():
    env = base_env(TORCHCOMM_TIMEOUT_SECONDS="60", TORCHCOMM_LOG_EVENTS="0")
    proc = run_launcher("--nproc-per-node", "2", "--max-restarts", "1",
                        worker("restart_comm.py"), env=env, timeout=180)
    assert "restarting all workers (restart 1 of 1)" in proc.stderr, proc.stderr
    for rank in (0, 1):
        assert f"rank {rank} attempt 0 agreed False sum 2" in proc.stdout, proc.stderr
        assert f"rank {rank} attempt 1 agreed True sum 2" in proc.stdout, proc.stderr
    assert proc.returncode == 0, proc.stderr
