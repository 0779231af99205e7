"""MPI jobs kept running between tests, so that a test pays for its ranks' ``import torch``
only when it needs a job of its own.

A pool job (``mpiexec -n N python -m tests.helpers.mpi_pool DIR``) is started on first use by
each pytest process for each job size, environment and CPU set, and serves one target after
another. Each rank connects to the test process's socket ``DIR/ctl`` and reads requests from it,
one JSON line each (``{"seq", "target", "kwargs", "dir", "env"}`` or ``{"exit": how}``; JSON
only, nothing is unpickled): for a request it puts its process state back as it was at its start
(:class:`tests.helpers.rank_state.RankState`), sets the request's per-target variables (the
target's own ``TC_GROUP_DIR``, flight-recorder prefix and ``PYTEST_CURRENT_TEST``), runs
``tests.helpers.rank_main.run_target`` as a fresh rank would (its result in
``<dir>/rank<r>.json``), and answers ``{"seq", "code", "leftovers"}``.

The rules that keep a pooled test as strict as one on a fresh job:

* a target that failed on any rank, or did not answer within the test's timeout, or a job that
  ended or answered out of turn, has its job killed (the ranks still running first dump their
  stacks to the job's log): the test fails with every rank's result and the tail of the job's
  log since the target started, and the next request starts a fresh job;
* a target that left something behind (a communicator not finalized, a thread still running,
  an exit handler, a pending MPI request: see :mod:`tests.helpers.rank_state`) ends its job
  through the ranks' normal exit, whose status is the test's as a fresh job's is;
* the timeout counts from the request (and the job's start, when the request started it);
* a job's ranks never outlive the test process: it ends its jobs at exit (``atexit``), kills
  what does not end, and a rank whose socket closes (the test process died) exits at once.

Only ``run_mpi_ranks`` calls without extra environment or ULFM use a pool; a test that passes
its own variables, runs under ULFM (to fail ranks), asks for a job of its own (``pool=False``:
it depends on MPI's initialisation), or starts its ranks through ``MpiJob`` (to kill, stop or
signal them, or to see them exit) gets a fresh job.
``TC_TEST_MPI_POOL=0`` turns pools off (every test a fresh job again).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.helpers.ranks import NO_RESULT, RankResult

#: "0": every MPI test starts a job of its own
POOL_ENV = "TC_TEST_MPI_POOL"
#: the variables a pool job sets per target (each test's own); any other difference in the
#: environment gets a job of its own
PER_TARGET = ("TC_GROUP_DIR", "TORCHCOMM_FR_DUMP_TEMP_FILE", "PYTEST_CURRENT_TEST")
#: once one rank failed, how long the others may still take to report before the job is killed
FAILED_GRACE_S = 5.0
#: jobs kept per test process; the least recently used one is ended beyond this
KEEP = 3
_CONTROL = "ctl"
_MARKER = b"tests.helpers.mpi_pool"  # in every pool rank's command line (see kill_ranks)


def pool_enabled() -> bool:
    return os.environ.get(POOL_ENV, "1") != "0"


class PoolFailure(AssertionError):
    """The pool job failed a target (or could not run it): the message has every rank's state
    and the job's log since the target started; the job is gone."""


class RankPool:
    """The test side of one pool job of ``n`` ranks."""

    def __init__(self, n: int, env: dict[str, str]) -> None:
        from tests.helpers.mpi_ranks import start_job

        self.n = n
        self.dir = Path(tempfile.mkdtemp(prefix="tc-mpipool-"))
        self.log = self.dir / "mpiexec.log"
        self.lock = threading.Lock()
        self.seq = 0
        self._exit_requested = False
        self.pids: dict[int, int] = {}
        self._conns: dict[int, socket.socket] = {}
        self._buffers: dict[int, bytes] = {}
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.dir / _CONTROL))
        self._server.listen(n)
        self.proc = start_job(n, ["tests.helpers.mpi_pool", str(self.dir)], env, self.dir)

    def alive(self) -> bool:
        return self.proc.poll() is None

    # ------------------------------------------------------------------------------ running
    def run(self, target: str, kwargs: dict[str, Any] | None, timeout: float,
            per_target_env: dict[str, str]) -> list[RankResult]:
        """Every rank's result of ``target``; the job stays only if every rank succeeded and
        left nothing behind. Raises :class:`PoolFailure` otherwise (the job is gone)."""
        deadline = time.monotonic() + timeout
        offset = self.log.stat().st_size if self.log.exists() else 0
        self.seq += 1
        tdir = self.dir / f"t{self.seq}"
        tdir.mkdir()
        try:
            self._connect(deadline, timeout, offset)
            env = {**per_target_env, "TC_GROUP_DIR": str(tdir), "TORCHCOMM_FR_DUMP_TEMP_FILE": str(tdir / "fr_rank_")}
            self._send_all({"seq": self.seq, "target": target, "kwargs": json.dumps(kwargs or {}), "dir": str(tdir),
                            "env": env})
            replies = self._replies(deadline, timeout, offset, tdir)
            leftovers = sorted({f"rank {r}: {what}" for r, rep in replies.items() for what in rep["leftovers"]})
            results = [self._result(r, tdir, 0, offset) for r in range(self.n)]
            if leftovers:  # ended as a fresh job of this target would end: the ranks' normal exit
                returncode = self._exit(max(deadline - time.monotonic(), 5.0))
                if returncode is None:
                    raise self._failure(f"the MPI job did not finish within {timeout} s (its ranks' exit, after "
                                        f"{'; '.join(leftovers)})", tdir, offset, hung=list(range(self.n)))
                why = f"(the rank pool's job was ended after this target, which left: {'; '.join(leftovers)})\n"
                for res in results:
                    res.returncode, res.stderr = returncode, why + self.output(offset)
                self._end()
            for res in results:
                res.extra["pool"] = {"seq": self.seq, "pid": self.pids[res.rank], "leftovers": leftovers}
            return results
        except BaseException:
            self.kill()  # a failure, a timeout, or the test interrupted (pytest-timeout): never reused
            raise
        finally:
            shutil.rmtree(tdir, ignore_errors=True)

    def _connect(self, deadline: float, timeout: float, offset: int) -> None:
        """Until every rank said hello (once per job)."""
        self._server.settimeout(0.1)
        while len(self._conns) < self.n:
            if not self.alive():
                raise PoolFailure(f"the MPI pool job ended before its ranks started (rc={self.proc.returncode})\n"
                                  f"{self.output(offset)}")
            if time.monotonic() >= deadline:
                raise PoolFailure(f"the MPI job did not finish within {timeout} s (its ranks never started)\n"
                                  f"{self.output(offset)}")
            try:
                conn, _ = self._server.accept()
            except socket.timeout:
                continue
            conn.settimeout(max(deadline - time.monotonic(), 1.0))
            line = b""
            try:
                while not line.endswith(b"\n"):
                    chunk = conn.recv(4096)  # the hello line: nothing else is sent before a request
                    if not chunk:
                        break
                    line += chunk
            except OSError:
                pass  # reported below
            conn.setblocking(True)
            if not line.endswith(b"\n"):
                conn.close()
                continue  # a rank that died at once: the job ends, reported above
            hello = json.loads(line)
            r = int(hello["rank"])
            self._conns[r], self.pids[r], self._buffers[r] = conn, int(hello["pid"]), b""

    def _send_all(self, message: dict[str, Any]) -> None:
        line = json.dumps(message).encode() + b"\n"
        for r in range(self.n):
            self._conns[r].sendall(line)

    def _replies(self, deadline: float, timeout: float, offset: int, tdir: Path) -> dict[int, dict[str, Any]]:
        """Every rank's answer to the current request; a :class:`PoolFailure` once a rank
        failed (its peers given :data:`FAILED_GRACE_S`), the job ended, or at ``deadline``."""
        replies: dict[int, dict[str, Any]] = {}
        failed_at: float | None = None
        while len(replies) < self.n:
            end = deadline if failed_at is None else min(deadline, failed_at + FAILED_GRACE_S)
            waiting = [self._conns[r] for r in range(self.n) if r not in replies]
            ready, _, _ = select.select(waiting, [], [], max(0.0, min(0.2, end - time.monotonic())))
            for conn in ready:
                r = next(k for k, c in self._conns.items() if c is conn)
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise self._failure(f"rank {r} of the MPI pool job closed its connection", tdir, offset)
                self._buffers[r] += chunk
                while b"\n" in self._buffers[r]:
                    line, self._buffers[r] = self._buffers[r].split(b"\n", 1)
                    reply = json.loads(line)
                    if reply.get("seq") != self.seq:
                        raise self._failure(f"rank {r} answered request {reply.get('seq')} during {self.seq}", tdir,
                                            offset)
                    replies[r] = reply
                    if reply["code"] != 0 and failed_at is None:
                        failed_at = time.monotonic()
            if not self.alive():
                raise self._failure(f"the MPI pool job ended (rc={self.proc.returncode})", tdir, offset)
            if time.monotonic() >= end and len(replies) < self.n:
                if failed_at is None:
                    raise self._failure(f"the MPI job did not finish within {timeout} s", tdir, offset,
                                        hung=[r for r in range(self.n) if r not in replies])
                break
        if failed_at is not None:
            failed = ", ".join(str(r) for r in sorted(replies) if replies[r]["code"] != 0)
            hung = [r for r in range(self.n) if r not in replies]
            late = f"; rank(s) {', '.join(map(str, hung))} had not finished {FAILED_GRACE_S:g} s later" if hung else ""
            raise self._failure(f"rank(s) {failed} failed{late}", tdir, offset, hung=hung)
        return replies

    def _failure(self, head: str, tdir: Path, offset: int, hung: list[int] | None = None) -> PoolFailure:
        """Kill the job (the ``hung`` ranks dump their stacks to its log first) and describe it."""
        from tests.helpers.rank_main import STACKS_SIGNAL

        for r in hung or []:
            try:
                os.kill(self.pids[r], STACKS_SIGNAL)
            except (KeyError, OSError):
                pass
        time.sleep(1.0 if hung else 0.3)  # the stacks, and the ranks' last output, reach the log
        self._stop()
        results = [self._result(r, tdir, self.proc.returncode, offset) for r in range(self.n)]
        lines = [f"rank {res.rank}: rc={res.returncode} error={res.error}" for res in results if res.error is not None]
        failure = PoolFailure("\n".join([head, *lines, f"(job of the MPI rank pool, target {self.seq})",
                                         self.output(offset)]))
        self._end()
        return failure

    def _result(self, r: int, tdir: Path, returncode: int | None, offset: int) -> RankResult:
        return RankResult.read(tdir / f"rank{r}.json", r, returncode, self.output(offset), NO_RESULT)

    def output(self, offset: int = 0) -> str:
        """The job's log since ``offset`` (its last 6000 characters)."""
        if not self.log.exists():
            return ""
        with open(self.log, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")[-6000:]

    # ------------------------------------------------------------------------------- ending
    def close(self, timeout: float = 30.0) -> int | None:
        """End the job once no target runs there any more: each rank calls ``MPI_Finalize`` and
        leaves without the interpreter's teardown (nothing of a target is left to run at exit: a
        target that left something ended its job itself, through the normal exit). Its exit
        status, ``None`` if it did not end within ``timeout`` (then it still runs)."""
        self.request_exit("finalize")
        code = self._exit(timeout)
        if code is not None:
            self._end()
        return code

    def request_exit(self, how: str) -> None:
        """Ask every rank to exit: ``"normal"`` (the interpreter's exit, as a fresh rank leaves
        after its target) or ``"finalize"`` (``MPI_Finalize`` only)."""
        if self.alive() and not self._exit_requested:
            self._exit_requested = True
            try:
                self._send_all({"exit": how})
            except (OSError, KeyError):
                pass  # a rank never connected or is gone: mpiexec ends the job

    def kill(self) -> None:
        self._stop()
        self._end()

    def _exit(self, timeout: float) -> int | None:
        self.request_exit("normal")
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.proc.returncode

    def _stop(self) -> None:
        from tests.helpers.mpi_ranks import end_job

        end_job(self.proc, self.dir, _MARKER)

    def _end(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        self._server.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# ------------------------------------------------------------------------------ the registry

_POOLS: dict[tuple[Any, ...], RankPool] = {}  # in order of use
_POOLS_LOCK = threading.Lock()
_AT_EXIT: list[bool] = []


def run_in_pool(n: int, target: str, kwargs: dict[str, Any] | None, timeout: float,
                env: dict[str, str]) -> list[RankResult] | None:
    """``target``'s results on this process's pool job for ``n`` ranks and ``env`` (the job's
    environment, its per-target variables aside) and the calling thread's CPUs (which a job's
    processes inherit: a test in a ``cpu_load.oversubscribed`` block confines them); ``None``
    when that job is busy (another thread runs a target there: the caller starts a job of its
    own)."""
    per_target = {k: env[k] for k in PER_TARGET if k in env}
    key = (os.getpid(), n, frozenset((k, v) for k, v in env.items() if k not in PER_TARGET),
           frozenset(os.sched_getaffinity(0)))
    with _POOLS_LOCK:
        pool = _POOLS.pop(key, None)
        if pool is None or not pool.alive():
            pool = RankPool(n, {k: v for k, v in env.items() if k not in PER_TARGET})
            if not _AT_EXIT:
                _AT_EXIT.append(True)
                atexit.register(close_all)
        _POOLS[key] = pool
        evicted = [_POOLS.pop(next(iter(_POOLS))) for _ in range(len(_POOLS) - KEEP)]
        busy = not pool.lock.acquire(blocking=False)
    for old in evicted:  # outside the registry's lock: one may still run another thread's target
        _close_quietly(old)
    if busy:
        return None
    try:
        results = pool.run(target, kwargs, timeout, per_target)
    except BaseException:
        _forget(key, pool)
        raise
    finally:
        pool.lock.release()
    if not pool.alive():
        _forget(key, pool)
    return results


def _forget(key: tuple[Any, ...], pool: RankPool) -> None:
    with _POOLS_LOCK:
        if _POOLS.get(key) is pool:
            del _POOLS[key]


def _close_quietly(pool: RankPool) -> None:
    with pool.lock:
        if pool.close(30.0) is None:
            pool.kill()


def close_all() -> None:
    """End every pool job of this process (killed if one does not end within 30 s)."""
    with _POOLS_LOCK:
        pools = [p for k, p in _POOLS.items() if k[0] == os.getpid()]
        _POOLS.clear()
    for pool in pools:
        pool.request_exit("finalize")  # all at once: they end side by side
    for pool in pools:
        _close_quietly(pool)


def pool_pids() -> list[list[int]]:
    """The rank pids of each of this process's pool jobs (for the pool's own tests)."""
    with _POOLS_LOCK:
        return [[p.pids[r] for r in sorted(p.pids)] for p in _POOLS.values() if p.alive()]


# --------------------------------------------------------------------------- the rank itself

def serve(job_dir: str) -> None:
    """One rank of a pool job: run each request's target and answer, until told to exit (see
    :meth:`RankPool.request_exit`); exit at once if the test process went away."""
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    with open(os.path.join(job_dir, f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    import torch  # noqa: F401 - what every rank imports first
    import torch.distributed  # noqa: F401

    import torchcomms  # noqa: F401
    from tests.helpers.rank_main import run_target
    from tests.helpers.rank_state import RankState
    from torchcomms.backends.mpi import backend as mpi_backend

    mpi_backend._runtime()  # MPI initialised as a fresh rank's first communicator initialises it
    state = RankState()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.path.join(job_dir, _CONTROL))
    sock.sendall(json.dumps({"rank": rank, "pid": os.getpid()}).encode() + b"\n")
    requests = sock.makefile("rb")
    argv0 = sys.argv[0]
    while True:
        line = requests.readline()
        if not line:  # the test process is gone: nobody else removes the job's directory
            if rank == 0:
                shutil.rmtree(job_dir, ignore_errors=True)
            os._exit(1)
        request = json.loads(line)
        if request.get("exit") == "finalize":
            sys.stdout.flush()
            sys.stderr.flush()
            mpi_backend._runtime()[0].Finalize()
            os._exit(0)
        if request.get("exit"):
            break
        state.restore(request["env"], [argv0, request["target"], request["kwargs"], request["dir"]])
        code = run_target(request["target"], request["kwargs"], os.path.join(request["dir"], f"rank{rank}.json"))
        leftovers = state.leftovers() if code == 0 else []
        sys.stdout.flush()
        sys.stderr.flush()
        sock.sendall(json.dumps({"seq": request["seq"], "code": code, "leftovers": leftovers}).encode() + b"\n")
    sock.close()
    sys.exit(0)


if __name__ == "__main__":
    serve(sys.argv[1])
