"""``mpiexec -n N torchcomms-run --backend mpi``: one launcher per MPI rank, each supervising its
rank's one worker (real MPI ranks, real launchers). Skipped where mpi4py or mpiexec is missing."""
from __future__ import annotations

import json
import os
import secrets
import subprocess

import pytest

from conftest import REPO, base_env, free_port, launcher_cmd, run_launcher, worker
from tests.helpers.mpi_ranks import mpi_available, mpiexec, mpiexec_env, ulfm_available

pytestmark = pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")


def _run_mpi_job(tmp_path, n: int, *launcher_args: str, ulfm: bool = False, **extra: str):
    session = tmp_path / "mpi-session"
    session.mkdir()
    env = mpiexec_env(base_env(PID_DIR=str(tmp_path), TORCHCOMM_CONTROL_SECRET=secrets.token_hex(32), **extra),
                      session)
    cmd = [mpiexec(), "-n", str(n), "--oversubscribe", *(["--with-ft", "ulfm"] if ulfm else []),
           *launcher_cmd("--backend", "mpi", "--master-port", str(free_port()), *launcher_args,
                         worker("mpi_job.py"))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    results = {}
    for r in range(n):
        path = tmp_path / f"result{r}.json"
        if path.exists():
            results[r] = json.loads(path.read_text())
    return proc, results


def test_each_launcher_runs_its_mpi_rank_and_rank_0_prints_the_summary(tmp_path):
    proc, results = _run_mpi_job(tmp_path, 3)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(results) == [0, 1, 2], proc.stderr[-4000:]
    for r, v in results.items():
        # the launcher's rank is the MPI rank; the control plane's failure monitor watches the comm
        assert (v["rank"], v["mpi_rank"], v["size"], v["sum"]) == (r, r, 3, 3.0), v
        assert v["monitor"] is True, v
    summaries = [ln for ln in proc.stderr.splitlines() if ln.startswith("torchcomms-run: job ")]
    assert len(summaries) == 1 and summaries[0].endswith("finished with exit code 0"), proc.stderr  # rank 0's
    assert "rank  host" in proc.stderr


def test_a_killed_rank_is_the_root_cause_under_policy_fail(tmp_path):
    proc, _ = _run_mpi_job(tmp_path, 3, VICTIM="1")
    assert proc.returncode == 137, proc.stderr[-4000:]
    assert "rank 1 on" in proc.stderr and "failed (SIGKILL)" in proc.stderr, proc.stderr[-4000:]
    assert "SIGKILL  <- root cause" in proc.stderr, proc.stderr[-4000:]


@pytest.mark.skipif(not ulfm_available(), reason="this mpiexec has no ULFM (--with-ft ulfm)")
def test_survivors_shrink_through_ulfm_under_policy_shrink(tmp_path):
    proc, results = _run_mpi_job(tmp_path, 3, "--on-failure", "shrink", ulfm=True, VICTIM="1", SHRINK="1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(results) == [0, 2], proc.stderr[-4000:]
    for v in results.values():
        # the launcher names the dead rank (its agent saw the SIGKILL); ULFM's detector lets MPI shrink
        assert v["raised"] == "PeerFailureError" and v["failed_ranks"] == [1], v
        assert v["survivors"] == [0, 2] and v["new_sum"] == 2.0 and v["agreed"] is True, v
    assert "SIGKILL  <- root cause" in proc.stderr


@pytest.mark.parametrize("args, words", [
    ((), "OMPI_COMM_WORLD_RANK"),
    (("--nproc-per-node", "2"), "one worker per launcher"),
    (("--on-failure", "restart"), "cannot restart"),
    (("--backend", "nccl"), "the only launcher backend is mpi"),
])
def test_flags_that_cannot_apply_are_refused(args, words):
    argv = ["--backend", "mpi", *args] if args[:1] != ("--backend",) else list(args)
    proc = run_launcher(*argv, worker("mpi_job.py"), env=base_env())
    assert proc.returncode != 0 and words in proc.stderr, proc.stderr
