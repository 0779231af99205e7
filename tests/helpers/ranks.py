"""Start real rank processes for multi-process tests and collect what each returned.

Each rank is a process with TORCHCOMM_RANK / TORCHCOMM_SIZE / MASTER_ADDR / MASTER_PORT set,
running ``module:function(**kwargs)`` through ``tests.helpers.rank_main``; its return value
(JSON) or its exception comes back as a :class:`RankResult`. Ranks are forked from a process
that has torch imported already (``tests.helpers.zygote``), except ranks that must leave
through the interpreter's normal exit, which start as fresh interpreters: a forked child's exit
does not reproduce what such tests guard against (with the engines' exit release disabled, the
dropped-tensor exit test aborted with SIGABRT in 2 of 2 runs of fresh ranks, in 0 of 2 of
forked ranks that left through the normal exit).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers.paths import REPO, child_pythonpath
from tests.helpers.ports import free_port
from tests.helpers.rank_main import EXIT_NORMALLY_ENV
from tests.helpers.zygote import ForkedRank, fork_ranks_enabled, zygote_for


#: ranks of one test share the host's cores: one intra-op thread each, as the launcher gives the
#: workers of a node (torchrun's rule), unless the environment sets it. With torch's default (a
#: thread per core) the ranks and pytest's workers oversubscribed the cores and the threads spun
#: waiting for each other: tests/fsdp2/test_fsdp2_ranks.py took 130-141 s on the 2-core VM
#: against 79-86 s with one thread each.
ONE_THREAD_EACH = ("OMP_NUM_THREADS", "1")
#: the error of a rank that wrote no result (``RankResult.read``'s ``missing`` for jobs whose every rank must)
NO_RESULT = {"type": "NoResult", "message": "the rank wrote no result"}


@dataclass
class RankResult:
    rank: int
    returncode: int | None
    value: Any = None
    error: dict[str, Any] | None = None
    stderr: str = ""
    elapsed: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def ok(self) -> bool:
        return self.returncode == 0 and self.error is None

    @classmethod
    def read(cls, out: Path, rank: int, returncode: int | None, stderr: str,
             missing: dict[str, Any] | None = None) -> RankResult:
        """``rank``'s result as ``rank_main`` wrote it to ``out``; ``missing``: its error when
        it wrote none."""
        res = cls(rank=rank, returncode=returncode, stderr=stderr)
        if out.exists():
            data = json.loads(out.read_text())
            res.value, res.error, res.elapsed = data.get("value"), data.get("error"), data.get("elapsed", 0.0)
        else:
            res.error = None if missing is None else dict(missing)
        return res


class RankGroup:
    """N rank processes; use as a context manager so none is ever left behind."""

    def __init__(self, n: int, target: str, kwargs: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, per_rank_env: dict[int, dict[str, str]] | None = None,
                 preload_target: bool = False) -> None:
        """``preload_target``: forked ranks come from a zygote that imported the target's module
        before forking (for modules whose import is heavy, such as FSDP's: the rank's first
        import, paid once per pytest worker instead of once per rank)."""
        self.n = n
        self.dir = Path(tempfile.mkdtemp(prefix="tc-ranks-"))
        port = free_port()
        self.procs: list[subprocess.Popen | ForkedRank] = []
        self.started = time.monotonic()
        for r in range(n):
            e = dict(os.environ)
            e.setdefault(*ONE_THREAD_EACH)
            e.update(
                TORCHCOMM_RANK=str(r), TORCHCOMM_SIZE=str(n), RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=child_pythonpath(),
                TORCHCOMM_FR_DUMP_TEMP_FILE=str(self.dir / "fr_rank_"), TC_GROUP_DIR=str(self.dir),
            )
            e.pop("TORCHCOMM_CONTROL_ADDR", None)
            e.update(env or {})
            e.update((per_rank_env or {}).get(r, {}))
            out, log_path = self.dir / f"rank{r}.json", self.dir / f"rank{r}.log"
            if fork_ranks_enabled() and e.get(EXIT_NORMALLY_ENV) != "1":
                zygote = zygote_for(e, REPO, (target.split(":")[0],) if preload_target else ())
                self.procs.append(zygote.fork(e, REPO, log_path, target, json.dumps(kwargs or {}), out))
                continue
            args = [sys.executable, "-m", "tests.helpers.rank_main", target, json.dumps(kwargs or {}), str(out)]
            with open(log_path, "wb") as log:
                self.procs.append(
                    subprocess.Popen(args, cwd=REPO, env=e, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
                )

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def signal(self, rank: int, sig: int) -> None:
        os.kill(self.procs[rank].pid, sig)

    def wait_ready(self, ready_dir: Path, n: int | None = None, timeout: float = 120.0) -> None:
        """Until ``n`` ranks (default: all) created their ``ready*`` file in ``ready_dir``; an
        ``AssertionError`` with the dead ranks' logs if one exits first, or at ``timeout``."""
        n = self.n if n is None else n
        deadline = time.monotonic() + timeout
        while len(list(ready_dir.glob("ready*"))) < n:
            assert time.monotonic() < deadline, "ranks never got ready"
            dead = [r for r, p in enumerate(self.procs) if p.poll() is not None]
            assert not dead, f"rank {dead} died early:\n" + "\n".join(
                (self.dir / f"rank{r}.log").read_text(errors="replace")[-3000:] for r in dead)
            time.sleep(0.05)

    def wait(self, timeout: float = 120.0, ranks: list[int] | None = None,
             failed_grace: float | None = None) -> list[RankResult]:
        """Every rank's result once all have exited; an ``AssertionError`` with every rank's state
        and stacks (``_hang_report``) if one is still running at ``timeout``. With
        ``failed_grace``, once a rank has failed (non-zero exit) the others get only that many
        more seconds: a peer blocked on the failed rank is then reported at once, and the report's
        first line names the rank that failed, not the one that was left waiting on it."""
        deadline = time.monotonic() + timeout
        which = list(range(self.n) if ranks is None else ranks)
        failed: int | None = None
        while True:
            running = [r for r in which if self.procs[r].poll() is None]
            if not running:
                return [self._result(r) for r in which]
            if failed is None and failed_grace is not None:
                failed = next((r for r in which if self.procs[r].returncode not in (None, 0)), None)
                if failed is not None:
                    deadline = min(deadline, time.monotonic() + failed_grace)
            if time.monotonic() >= deadline:
                report = self._hang_report()
                self.kill_all()
                if failed is not None:
                    res = self._result(failed)
                    why = f": {res.error['type']}: {res.error['message'][:300]}" if res.error else ""
                    head = (f"rank {failed} failed (rc={res.returncode}{why}); rank(s) "
                            f"{', '.join(map(str, running))} had not finished {failed_grace:g} s later")
                else:
                    head = f"rank {running[0]} did not finish within {timeout} s"
                raise AssertionError(f"{head}\n{report}") from None
            time.sleep(0.05)

    def _hang_report(self) -> str:
        """Every rank's state for a timeout: the ranks still running dump their threads' stacks
        first (``rank_main.STACKS_SIGNAL``), so the report shows where each one was waiting."""
        from tests.helpers.rank_main import STACKS_SIGNAL

        running = [p for p in self.procs if p.poll() is None]
        for p in running:
            try:
                os.kill(p.pid, STACKS_SIGNAL)
            except ProcessLookupError:
                pass
        if running:
            time.sleep(1.0)  # time to write the stacks
        parts = []
        for r, p in enumerate(self.procs):
            res = self._result(r)
            state = "still running" if p.poll() is None else f"exited rc={p.returncode}"
            error = f" error={res.error['type']}: {res.error['message'][:500]}" if res.error else ""
            parts.append(f"--- rank {r}: {state}{error}\n{res.stderr[-4000:]}")
        return "\n".join(parts)

    def _result(self, r: int) -> RankResult:
        p = self.procs[r]
        log = self.dir / f"rank{r}.log"
        err = log.read_text(errors="replace") if log.exists() else ""
        return RankResult.read(self.dir / f"rank{r}.json", r, p.returncode, err)

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_all()


def run_ranks(n: int, target: str, kwargs: dict[str, Any] | None = None, timeout: float = 120.0,
              env: dict[str, str] | None = None, failed_grace: float = 20.0,
              preload_target: bool = False) -> list[RankResult]:
    """Run ``target`` on ``n`` ranks and return every rank's result; asserts all succeeded (so
    once one rank failed, the others are given only ``failed_grace`` more seconds)."""
    with RankGroup(n, target, kwargs, env, preload_target=preload_target) as g:
        results = g.wait(timeout, failed_grace=failed_grace)
    bad = [r for r in results if not r.ok()]
    assert not bad, "\n".join(f"rank {r.rank}: rc={r.returncode} error={r.error}\n{r.stderr[-3000:]}" for r in bad)
    return results
