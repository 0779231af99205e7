"""Start real MPI ranks (``mpiexec``) for the tests that run on the mpi backend.

The counterpart of :mod:`tests.helpers.ranks` for ranks that must be one MPI job: each rank
runs ``module:function(**kwargs)`` under ``mpiexec -n N`` and its result comes back as a
``RankResult``. Ranks get their rank and size from Open MPI (``OMPI_COMM_WORLD_*``); the
runner's TORCHCOMM_/torchrun variables are removed so they cannot override it.
``run_mpi_ranks`` runs a healthy target on this process's rank pool (:mod:`tests.helpers.mpi_pool`:
jobs kept between tests, each target on ranks put back as fresh); ``MpiJob`` is always a job of
its own.
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

from tests.helpers.mpi_pool import pool_enabled, run_in_pool
from tests.helpers.paths import REPO, child_pythonpath
from tests.helpers.ranks import NO_RESULT, ONE_THREAD_EACH, RankResult

#: variables of other launchers that must not reach an MPI rank
_FOREIGN = ("TORCHCOMM_RANK", "TORCHCOMM_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
            "TORCHCOMM_CONTROL_ADDR", "PMI_RANK", "PMI_SIZE")


def mpiexec() -> str | None:
    """The ``mpiexec`` Open MPI's wheel installed beside this Python (the MPI that this Python's
    mpi4py was built against), else the one on PATH. The wheel's own binary comes first: a PATH
    entry may be a wrapper (a pyenv shim) that starts it as a child with another pid."""
    import sysconfig

    beside = Path(sysconfig.get_path("scripts")) / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def mpiexec_env(env: dict[str, str], job_dir: Path) -> dict[str, str]:
    """``env`` for one ``mpiexec`` job whose Open MPI session directory lies in ``job_dir``, a
    directory of that job alone.

    Open MPI keeps its session directory at ``$TMPDIR/ompi.<mpiexec's pid>``. A killed mpiexec
    leaves it behind, and a later mpiexec that is given the same pid (pids wrap at 32768 on the CI
    machine) fails at start with "The PMIx server's listener thread failed to start"."""
    return {**env, "TMPDIR": str(job_dir), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def mpi_available() -> bool:
    """mpi4py importable and an ``mpiexec`` found."""
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None and mpiexec() is not None


@functools.lru_cache(maxsize=1)
def open_mpi_major() -> int | None:
    """The major version of this ``mpiexec``'s Open MPI (``mpiexec --version``), None for another MPI."""
    import re

    exe = mpiexec()
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Open MPI\)? (\d+)\.", out)
    return int(m.group(1)) if m else None


@functools.lru_cache(maxsize=1)
def ulfm_available() -> bool:
    """Whether this ``mpiexec`` runs a job with ``--with-ft ulfm`` (Open MPI 5's wheel does; older
    system Open MPIs refuse the option)."""
    exe = mpiexec()
    if exe is None:
        return False
    with tempfile.TemporaryDirectory(prefix="tc-mpi-probe-") as session:
        try:
            proc = subprocess.run([exe, "--with-ft", "ulfm", "--oversubscribe", "-n", "1", "true"],
                                  env=mpiexec_env(dict(os.environ), Path(session)), capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return proc.returncode == 0


def rank_env(group_dir: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an MPI test rank whose group directory (``TC_GROUP_DIR``) is
    ``group_dir``: this process's, less other launchers' variables, plus ``env``."""
    e = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    e.setdefault(*ONE_THREAD_EACH)
    e.update(PYTHONPATH=child_pythonpath(), TC_GROUP_DIR=str(group_dir), TC_BACKEND="mpi",
             TORCHCOMM_FR_DUMP_TEMP_FILE=str(group_dir / "fr_rank_"))
    e.update(env or {})
    return e


class MpiJob:
    """One ``mpiexec`` job of ``n`` ranks; a context manager that never leaves it (or its
    directory) behind."""

    def __init__(self, n: int, target: str, kwargs: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                 ulfm: bool = False) -> None:
        self.n = n
        self.dir = Path(tempfile.mkdtemp(prefix="tc-mpi-"))
        self.log = self.dir / "mpiexec.log"
        self.proc = start_job(n, ["tests.helpers.mpi_rank_main", target, json.dumps(kwargs or {}), str(self.dir)],
                              rank_env(self.dir, env), self.dir, ulfm)

    def pid_of(self, rank: int, timeout: float = 120.0) -> int:
        """The process id of ``rank`` (written by the rank once it started)."""
        path = self.dir / f"pid{rank}"
        deadline = time.monotonic() + timeout
        while not path.exists() or not path.read_text().strip():
            assert self.proc.poll() is None, f"mpiexec ended early:\n{self.output()}"
            assert time.monotonic() < deadline, f"rank {rank} never started"
            time.sleep(0.02)
        return int(path.read_text())

    def wait_ready(self, ranks: list[int], timeout: float = 120.0) -> None:
        """Until each of ``ranks`` created ``ready<rank>`` in the job's directory."""
        deadline = time.monotonic() + timeout
        while not all((self.dir / f"ready{r}").exists() for r in ranks):
            assert self.proc.poll() is None, f"mpiexec ended early:\n{self.output()}"
            assert time.monotonic() < deadline, f"ranks {ranks} never got ready\n{self.output()}"
            time.sleep(0.01)

    def results_of(self, ranks: list[int], timeout: float = 120.0) -> list[RankResult]:
        """The results of ``ranks`` once each wrote one (the job may still run: e.g. a stopped
        peer keeps it from finishing)."""
        deadline = time.monotonic() + timeout
        while not all((self.dir / f"rank{r}.json").exists() for r in ranks):
            if self.proc.poll() is not None:
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
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the MPI job did not finish within {timeout} s\n{self.output()}") from None
        return [self._result(r) for r in range(self.n)]

    def _result(self, r: int) -> RankResult:
        return RankResult.read(self.dir / f"rank{r}.json", r, self.proc.returncode, self.output(), NO_RESULT)

    def kill(self) -> None:
        end_job(self.proc, self.dir, b"mpi_rank_main")

    def __enter__(self) -> MpiJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def start_job(n: int, module_args: list[str], env: dict[str, str], job_dir: Path,
              ulfm: bool = False) -> subprocess.Popen[bytes]:
    """``mpiexec -n n python -m <module_args>`` (with ``--with-ft ulfm`` if asked) in a session of
    its own, its session directory and output (``mpiexec.log``) in ``job_dir``."""
    # --bind-to none: the ranks run on the CPUs of the thread that starts the job, as a test that
    # confines itself to one CPU (cpu_load.oversubscribed) expects; Open MPI 4 binds each rank to
    # a core of its own by default where there are cores enough (the H200 host's 16)
    args = [mpiexec() or "mpiexec", "-n", str(n), "--oversubscribe", "--bind-to", "none",
            *(["--with-ft", "ulfm"] if ulfm else []), sys.executable, "-m", *module_args]
    with open(job_dir / "mpiexec.log", "ab") as log:
        return subprocess.Popen(args, cwd=REPO, env=mpiexec_env(env, job_dir), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def end_job(proc: subprocess.Popen[bytes], job_dir: Path, marker: bytes) -> None:
    """SIGKILL a job's ``mpiexec`` (its process group) if it still runs, then every rank of the
    job still alive (:func:`kill_ranks`)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
    kill_ranks(job_dir, marker)


def kill_ranks(job_dir: Path, marker: bytes) -> None:
    """SIGKILL every rank process of ``job_dir`` (its ``pid<r>`` files) still alive: mpiexec's
    daemons start ranks outside its process group, and a rank it left behind (a stopped one,
    say) would outlive the test. ``marker`` is in the command line of every rank of the job."""
    killed = []
    for path in job_dir.glob("pid*"):
        try:
            pid = int(path.read_text())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker not in f.read():
                    continue  # the rank is gone and its pid reused
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ValueError, OSError):
            pass
    deadline = time.monotonic() + 10
    while any(process_running(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.02)


def process_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_mpi_ranks(n: int, target: str, kwargs: dict[str, Any] | None = None, timeout: float = 120.0,
                  env: dict[str, str] | None = None, ulfm: bool = False, pool: bool = True) -> list[RankResult]:
    """Run ``target`` on an ``n``-rank MPI job; asserts every rank succeeded. Without ``env``
    or ``ulfm``, the job is this process's pool job for ``n`` ranks (see
    :mod:`tests.helpers.mpi_pool`); ``pool=False``: a job of its own (for a target that depends
    on MPI's initialisation)."""
    results = None
    if pool and not env and not ulfm and pool_enabled():
        results = run_in_pool(n, target, kwargs, timeout, rank_env(Path("<per-target>")))
    if results is None:
        with MpiJob(n, target, kwargs, env, ulfm) as job:
            results = job.wait(timeout)
    bad = [r for r in results if r.error is not None]
    assert not bad and results[0].returncode == 0, "\n".join(
        f"rank {r.rank}: rc={r.returncode} error={r.error}" for r in bad) + "\n" + results[0].stderr
    return results
