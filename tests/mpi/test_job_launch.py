"""The MPI test jobs' own launcher: a job whose ``mpiexec`` failed before it started any rank
(Open MPI's runtime on a loaded host: "The PMIx server's listener thread failed to start",
seen in suites on the 2-core box) is started once more, whichever way the test waits for it."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import mpi_ranks
from tests.helpers.mpi_ranks import MpiJob, mpi_available, run_mpi_ranks

pytestmark = pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")


def _failing_once(tmp_path: Path) -> str:
    real = mpi_ranks.mpiexec()
    marker = tmp_path / "failed-once"
    fake = tmp_path / "mpiexec"
    fake.write_text(f"""#!/bin/sh
if [ ! -e '{marker}' ]; then
  touch '{marker}'
  echo "The PMIx server's listener thread failed to start. We cannot continue." >&2
  exit 1
fi
exec '{real}' "$@"
""")
    fake.chmod(0o755)
    return str(fake)


def test_run_mpi_ranks_starts_a_job_whose_launcher_failed_again(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _failing_once(tmp_path)
    monkeypatch.setattr(mpi_ranks, "mpiexec", lambda: fake)
    results = run_mpi_ranks(2, "tests.mpi.workers:collective_paths", timeout=120)
    assert [r.value["sums_ok"] for r in results] == [True, True]
    assert (tmp_path / "failed-once").exists()


def test_waiting_for_ranks_to_get_ready_starts_the_job_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _failing_once(tmp_path)
    monkeypatch.setattr(mpi_ranks, "mpiexec", lambda: fake)
    with MpiJob(2, "tests.mpi.workers:ready_then_return") as job:
        job.wait_ready([0, 1])
        results = job.wait(120)
    assert [r.value for r in results] == [0, 1]
