"""A worker that SIGKILL cannot end (uninterruptible sleep, state D) must not hang the job.

A real D-state process cannot be made portably in a test, so the stuck rank is a fake process
handle injected at the process-spawning seam (``unkillable.py``: the worker really runs, but
the agent's signals never reach it and its exit is never reported). Everything else is real:
the agent loop runs end to end in its own process (``unkillable.py`` runs ``torchcomms-run``)
and the other ranks are real worker processes. ``KILL_WAIT_S`` is shortened to 1 s.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, base_env, pid_alive, wait_for, worker

DRIVER = str(Path(__file__).with_name("unkillable.py"))
KILL_WAIT = 1.0


def _run(*args: str, rank: int, timeout: float = 40, **env: str,
         ) -> tuple[subprocess.CompletedProcess[str], int, float]:
    """Run the agent with rank ``rank`` unkillable; returns (result, fake pid, seconds)."""
    e = base_env(UNKILLABLE_RANK=str(rank), KILL_WAIT_S=str(KILL_WAIT), **env)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, DRIVER, *args], env=e, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the agent and the fake stuck worker with it
        out, err = proc.communicate()
        raise AssertionError(f"the agent hung on an unkillable worker:\n{err}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    elapsed = time.monotonic() - t0
    m = re.search(r"\[unkillable\] rank \d+ pid (\d+)", err)
    assert m, err
    pid = int(m.group(1))
    # the fake dies with the agent (PDEATHSIG); a real D-state one would when the kernel lets it
    assert wait_for(lambda: not pid_alive(pid), timeout=10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), pid, elapsed


def _assert_reported(err: str, rank: int, pid: int) -> None:
    assert re.search(rf"rank {rank} \(pid {pid}\) on \S+ is UNREAPABLE: not exited "
                     rf"{KILL_WAIT:g} s after SIGKILL; process state [A-Za-z] \(", err), err
    assert f"exiting without reaping rank {rank} of attempt 0 (pid {pid}," in err, err


def test_unreapable_worker_is_given_up_and_the_group_restarts():
    """Rank 0 fails; rank 1 cannot be killed: it is reported and given up after the bounded
    wait, the group restarts (a fresh rank 1 beside the stuck one) and the job succeeds."""
    proc, pid, elapsed = _run("--nproc-per-node", "2", "--max-restarts", "1",
                              "--grace-period", "0.5", worker("fails_once.py"), rank=1)
    assert proc.returncode == 0, proc.stderr
    _assert_reported(proc.stderr, 1, pid)
    assert "rank 0 failed; restarting all workers (restart 1 of 1)" in proc.stderr
    files = dict(re.findall(r"rank 1 attempt (\d) error file (\S+)", proc.stdout))
    assert set(files) == {"0", "1"} and files["0"] != files["1"], proc.stdout  # no shared files
    assert "rank 0 attempt 1" in proc.stdout, proc.stdout
    assert elapsed < 25, elapsed


def test_given_up_workers_leave_no_output_readers_behind():
    """Rank 1 is unreapable in attempts 0 and 1 (rank 0 fails in both) and the job succeeds
    in attempt 2: each given-up worker's output readers stop when it is given up (its pipes
    stay open as long as it lives), so the agent's reader threads do not pile up across
    restarts: none are alive when each attempt starts (before, each give-up left its two
    reader threads blocked on its pipes until the agent exited)."""
    proc, pid, elapsed = _run("--nproc-per-node", "2", "--max-restarts", "2",
                              "--grace-period", "0.5", worker("fails_once.py"), rank=1,
                              UNKILLABLE_ATTEMPTS="0,1", FAIL_ATTEMPTS="2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("is UNREAPABLE") == 2, proc.stderr
    alive = dict(re.findall(r"\[unkillable\] attempt (\d) rank 0: (\d+) output readers",
                            proc.stderr))
    assert alive == {"0": "0", "1": "0", "2": "0"}, proc.stderr
    assert elapsed < 25, elapsed


def test_unreapable_worker_without_restarts_left_fails_the_job_naming_it():
    """No restarts: the job exits with the root cause's code and its summary names the
    stuck rank, without waiting for it at exit."""
    proc, pid, elapsed = _run("--nproc-per-node", "2", "--grace-period", "0.5",
                              worker("fails_once.py"), rank=1)
    assert proc.returncode == 3, proc.stderr  # root cause: rank 0's exit 3
    _assert_reported(proc.stderr, 1, pid)
    assert re.search(rf"^1 +\S+ +1 +{pid} +unreapable, state [A-Za-z] ", proc.stderr, re.M), \
        proc.stderr
    assert elapsed < 25, elapsed


def test_hung_rank_that_sigkill_cannot_end_fails_the_job(tmp_path):
    """A hung rank (heartbeats stopped) is SIGKILLed by the agent and never exits: it is
    given up as unreapable, that is a failure (policy fail), and it is the root cause."""
    proc, pid, elapsed = _run("--nproc-per-node", "2", "--grace-period", "1",
                              "--hung-timeout", "2", worker("hung.py"), rank=1, PID_DIR=str(tmp_path))
    assert "rank 1 on" in proc.stderr and "is hung (no heartbeat for" in proc.stderr
    _assert_reported(proc.stderr, 1, pid)
    assert "rank 1 is unreapable; stopping the job" in proc.stderr
    assert proc.returncode == 1, proc.stderr
    assert "root cause: rank 1 on" in proc.stderr and f"pid {pid} was still alive" in proc.stderr
    assert elapsed < 25, elapsed
