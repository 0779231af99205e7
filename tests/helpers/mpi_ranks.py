"""Start real MPI ranks (``mpiexec``) for the tests that run on the mpi backend.

The counterpart of :mod:`tests.helpers.ranks` for ranks that must be one MPI job: each rank
runs ``module:function(**kwargs)`` under ``mpiexec -n N`` and its result comes back as a
``RankResult``. Ranks get their rank and size from Open MPI (``OMPI_COMM_WORLD_*``); the
runner's TORCHCOMM_/torchrun variables are removed so they cannot override it.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.helpers.paths import REPO, child_pythonpath
from tests.helpers.ranks import RankResult

#: variables of other launchers that must not reach an MPI rank
_FOREIGN = ("TORCHCOMM_RANK", "TORCHCOMM_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
            "TORCHCOMM_CONTROL_ADDR", "PMI_RANK", "PMI_SIZE")


def mpiexec() -> str | None:
    """The ``mpiexec`` on PATH, else the one Open MPI's wheel installed beside this Python."""
    import sysconfig

    found = shutil.which("mpiexec")
    if found:
        return found
    beside = Path(sysconfig.get_path("scripts")) / "mpiexec"
    return str(beside) if beside.exists() else None


def mpi_available() -> bool:
    """mpi4py importable and an ``mpiexec`` found."""
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None and mpiexec() is not None


@functools.lru_cache(maxsize=1)
def ulfm_available() -> bool:
    """Whether this ``mpiexec`` runs a job with ``--with-ft ulfm`` (Open MPI 5's wheel does; older
    system Open MPIs refuse the option)."""
    exe = mpiexec()
    if exe is None:
        return False
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    try:
        proc = subprocess.run([exe, "--with-ft", "ulfm", "--oversubscribe", "-n", "1", "true"], env=env,
                              capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


class MpiJob:
    """One ``mpiexec`` job of ``n`` ranks; a context manager that never leaves it behind. A job
    whose MPI runtime failed before it started any rank is started once more."""

    def __init__(self, n: int, target: str, kwargs: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                 ulfm: bool = False) -> None:
        self.n = n
        self.dir = Path(tempfile.mkdtemp(prefix="tc-mpi-"))
        e = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
        e.update(PYTHONPATH=child_pythonpath(), TC_GROUP_DIR=str(self.dir), TC_BACKEND="mpi",
                 TORCHCOMM_FR_DUMP_TEMP_FILE=str(self.dir / "fr_rank_"),
                 OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        e.update(env or {})
        args = [mpiexec() or "mpiexec", "-n", str(n), "--oversubscribe"]
        if ulfm:
            args += ["--with-ft", "ulfm"]
        args += [sys.executable, "-m", "tests.helpers.mpi_rank_main", target, json.dumps(kwargs or {}), str(self.dir)]
        self.log = self.dir / "mpiexec.log"
        self._args, self._env, self._launches = args, e, 0
        self._launch()

    def _launch(self) -> None:
        self._launches += 1
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self._args, cwd=REPO, env=self._env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def _relaunched(self) -> bool:
        """After ``mpiexec`` ended: start it once more if its runtime failed before starting any
        rank (Open MPI's launcher on a loaded host, e.g. "The PMIx server's listener thread failed
        to start"); nothing of the library ran. True if it was started again."""
        if self._launches > 1 or self.proc.returncode == 0 or any(self.dir.glob("pid*")):
            return False
        self._launch()
        return True

    def pid_of(self, rank: int, timeout: float = 120.0) -> int:
        """The process id of ``rank`` (written by the rank once it started)."""
        path = self.dir / f"pid{rank}"
        deadline = time.monotonic() + timeout
        while not path.exists() or not path.read_text().strip():
            assert self.proc.poll() is None or self._relaunched(), f"mpiexec ended early:\n{self.output()}"
            assert time.monotonic() < deadline, f"rank {rank} never started"
            time.sleep(0.02)
        return int(path.read_text())

    def wait_ready(self, ranks: list[int], timeout: float = 120.0) -> None:
        """Until each of ``ranks`` created ``ready<rank>`` in the job's directory."""
        deadline = time.monotonic() + timeout
        while not all((self.dir / f"ready{r}").exists() for r in ranks):
            assert self.proc.poll() is None or self._relaunched(), f"mpiexec ended early:\n{self.output()}"
            assert time.monotonic() < deadline, f"ranks {ranks} never got ready\n{self.output()}"
            time.sleep(0.01)

    def results_of(self, ranks: list[int], timeout: float = 120.0) -> list[RankResult]:
        """The results of ``ranks`` once each wrote one (the job may still run: e.g. a stopped
        peer keeps it from finishing)."""
        deadline = time.monotonic() + timeout
        while not all((self.dir / f"rank{r}.json").exists() for r in ranks):
            if self.proc.poll() is not None and not self._relaunched():
                break
            if time.monotonic() >= deadline:
                self.kill()
                raise AssertionError(f"ranks {ranks} wrote no result within {timeout} s\n{self.output()}")
            time.sleep(0.02)
        return [self._result(r) for r in ranks]

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""

    def wait(self, timeout: float = 120.0) -> list[RankResult]:
        """Every rank's result once ``mpiexec`` ended; an ``AssertionError`` with its output at ``timeout``."""
        deadline = time.monotonic() + timeout
        try:
            self.proc.wait(timeout)
            if self._relaunched():
                self.proc.wait(max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the MPI job did not finish within {timeout} s\n{self.output()}") from None
        return [self._result(r) for r in range(self.n)]

    def _result(self, r: int) -> RankResult:
        out = self.dir / f"rank{r}.json"
        res = RankResult(rank=r, returncode=self.proc.returncode, stderr=self.output())
        if out.exists():
            data = json.loads(out.read_text())
            res.value, res.error, res.elapsed = data.get("value"), data.get("error"), data.get("elapsed", 0.0)
        else:
            res.error = {"type": "NoResult", "message": "the rank wrote no result"}
        return res

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self._kill_ranks()

    def _kill_ranks(self) -> None:
        """SIGKILL every rank process still alive: mpiexec's daemons start ranks outside its
        process group, and a rank it left behind (a stopped one, say) would outlive the test."""
        killed = []
        for path in self.dir.glob("pid*"):
            try:
                pid = int(path.read_text())
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"mpi_rank_main" not in f.read():
                        continue  # the rank is gone and its pid reused
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ValueError, OSError):
                pass
        deadline = time.monotonic() + 10
        while any(process_running(p) for p in killed) and time.monotonic() < deadline:
            time.sleep(0.02)

    def __enter__(self) -> MpiJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def process_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_mpi_ranks(n: int, target: str, kwargs: dict[str, Any] | None = None, timeout: float = 120.0,
                  env: dict[str, str] | None = None, ulfm: bool = False) -> list[RankResult]:
    """Run ``target`` on an ``n``-rank MPI job; asserts every rank succeeded."""
    with MpiJob(n, target, kwargs, env, ulfm) as job:
        results = job.wait(timeout)
    bad = [r for r in results if r.error is not None]
    assert not bad and results[0].returncode == 0, "\n".join(
        f"rank {r.rank}: rc={r.returncode} error={r.error}" for r in bad) + "\n" + results[0].stderr
    return results
