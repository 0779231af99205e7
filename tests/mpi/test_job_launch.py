"""The MPI test jobs' own launcher: each ``mpiexec`` keeps Open MPI's session directory in the
job's own directory, so the session directory a killed ``mpiexec`` left behind cannot stop a later
job that is given the same pid ("The PMIx server's listener thread failed to start", exit 213)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.mpi_ranks import MpiJob, mpi_available, mpiexec, mpiexec_env

pytestmark = pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")

LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
PID_MAX = Path("/proc/sys/kernel/pid_max")


def _stale_session_dir(host_tmp: Path) -> Path:
    """The session directory of a real ``mpiexec`` killed while its rank ran (as a test's
    deadline kills one), left where Open MPI put it: ``host_tmp/ompi.<its pid>``."""
    env = mpiexec_env(dict(os.environ), host_tmp)  # what a job without a directory of its own had
    started = host_tmp / "rank-pid"
    rank = f"import os, time; open({str(started)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    proc = subprocess.Popen([mpiexec(), "-n", "1", sys.executable, "-c", rank], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (started.exists() and started.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, "the mpiexec job never started its rank"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    os.kill(int(started.read_text()), signal.SIGKILL)
    sessions = list(host_tmp.glob("ompi.*"))
    assert len(sessions) == 1, sorted(p.name for p in host_tmp.iterdir())
    if sessions[0].name != f"ompi.{proc.pid}":
        # Open MPI 4 (ORTE) names it by host and uid ("ompi.<host>.<uid>"): no later job's pid can
        # collide with it, which is the failure this test guards against (Open MPI 5's PRRTE)
        pytest.skip(f"this Open MPI names its session directory {sessions[0].name!r}, not by mpiexec's pid")
    return sessions[0]


def _set_next_pid(pid: int) -> None:
    LAST_PID.write_text(str(pid - 1))


def _pid_ahead(distance: int) -> int:
    """A pid ``distance`` past the last one given, wrapped below ``pid_max`` as the kernel wraps
    (past 300, the reserved ones): near the end of the range the plain sum was refused (EINVAL)."""
    pid_max = int(PID_MAX.read_text())
    pid = int(LAST_PID.read_text()) + distance
    return pid if pid < pid_max else 300 + distance + pid % pid_max


def test_a_job_given_the_pid_of_a_killed_mpiexec_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        _set_next_pid(_pid_ahead(1))
    except OSError:
        pytest.skip("the next pid cannot be chosen here (/proc/sys/kernel/ns_last_pid is not writable)")
    host_tmp = tmp_path / "host-tmp"
    host_tmp.mkdir()
    stale = _stale_session_dir(host_tmp)
    monkeypatch.setenv("TMPDIR", str(host_tmp))
    for _ in range(10):  # another process of the machine may take the chosen pid first
        pid = _pid_ahead(300)
        # an mpiexec that started on the stale directory failed and removed it on its way out
        assert stale.is_dir(), "the job's mpiexec was started on the killed one's session directory"
        stale = stale.rename(host_tmp / f"ompi.{pid}")
        _set_next_pid(pid)
        with MpiJob(2, "tests.mpi.workers:collective_paths") as job:
            results = job.wait(120)
            if job.proc.pid != pid:
                continue
            assert job.proc.returncode == 0, job.output()
            assert [r.value["sums_ok"] for r in results] == [True, True], job.output()
            assert stale.is_dir()  # the job did not need it gone
            return
    pytest.fail("no mpiexec was started with the chosen pid in 10 tries")


def test_a_pid_chosen_near_the_end_of_the_range_wraps_as_the_kernels_do() -> None:
    """The chosen pid was refused (EINVAL) once the pid counter neared pid_max (32768 on CI)."""
    pid_max = int(PID_MAX.read_text())
    try:
        _set_next_pid(pid_max - 50)
    except OSError:
        pytest.skip("the next pid cannot be chosen here (/proc/sys/kernel/ns_last_pid is not writable)")
    pid = _pid_ahead(300)
    assert 300 < pid < pid_max
    _set_next_pid(pid)
    assert int(LAST_PID.read_text()) == pid - 1


def test_the_jobs_session_directory_lies_in_its_own_directory_and_goes_with_it(tmp_path: Path) -> None:
    assert mpiexec_env({"TMPDIR": "/tmp"}, tmp_path)["TMPDIR"] == str(tmp_path)
    with MpiJob(2, "tests.mpi.workers:ready_then_return") as job:
        job.wait_ready([0, 1])
        # Open MPI 5 names it "ompi.<mpiexec's pid>", Open MPI 4 "ompi.<host>.<uid>"
        assert [p.is_dir() for p in job.dir.glob("ompi.*")] == [True], sorted(p.name for p in job.dir.iterdir())
        results = job.wait(120)
        assert [r.value for r in results] == [0, 1]
    assert not job.dir.exists()
