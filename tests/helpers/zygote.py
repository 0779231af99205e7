"""Rank processes forked from a pre-imported process, so that a test pays for ``import torch``
once per pytest worker instead of once per rank.

The zygote (``python -m tests.helpers.zygote [module ...]``) imports torch and torchcomms, and the
modules named on its command line (a test's heavy rank module, e.g. one that imports FSDP: what
the rank would import first anyway), then serves fork
requests read from its stdin, one JSON line each: ``{"env", "cwd", "log", "target",
"kwargs", "out", "cpus"}``. For each it forks a child that starts a session of its own, takes the
request's environment, working directory, log and CPU affinity (the requesting thread's), and runs
``tests.helpers.rank_main.run_target`` exactly as a ``python -m tests.helpers.rank_main``
process would; the zygote answers ``{"pid": ...}``, and ``{"exit": pid, "code": ...}`` once that
child ended (negative: killed by that signal, as ``subprocess`` reports it). The child is left
a zombie until the test side has read its code and sends ``{"reap": pid}`` (answered
``{"reaped": pid}``), as a ``Popen`` child stays until it is waited for: its pid cannot be
reused meanwhile.

The zygote never starts a thread (fork copies only the forking thread, so a lock held by
another thread would stay held in every child). It also imports nothing that reads the
environment at import time in a way a rank could depend on: the library reads its
``TORCHCOMM_*`` settings on first use, after the child has taken its own environment.

:class:`ForkedRank` is the test side's handle on one child: the part of ``subprocess.Popen``
that :class:`~tests.helpers.ranks.RankGroup` and its callers use (``pid``, ``poll``, ``wait``,
``returncode``). ``TC_TEST_FORK_RANKS=0`` turns the zygote off (every rank a fresh
interpreter again).
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: "0": every rank is a fresh ``python -m tests.helpers.rank_main`` process
FORK_RANKS_ENV = "TC_TEST_FORK_RANKS"


def fork_ranks_enabled() -> bool:
    return os.environ.get(FORK_RANKS_ENV, "1") != "0"


class ForkedRank:
    """One rank forked by the zygote: ``pid``, ``returncode``, ``poll()`` and ``wait(timeout)``."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid
        self._code: int | None = None
        self._lock = threading.Lock()

    @property
    def returncode(self) -> int | None:
        """The exit code once the child ended; the first read lets the zygote reap the child
        (until then its pid stays taken, as a ``Popen`` child's does until it is waited for, so
        a signal sent by pid can never reach a process that reused it). The code is kept here,
        not by pid: once reaped, the pid may name a later child of the same zygote."""
        with self._lock:
            if self._code is None:
                self._code = self._zygote.exit_code(self.pid, release=True)
            return self._code

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.returncode) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"forked rank {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        return code


class Zygote:
    """The test process's side of one zygote: sends fork requests, collects exit codes."""

    def __init__(self, env: dict[str, str], cwd: Path, preload: tuple[str, ...] = ()) -> None:
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.zygote", *preload], cwd=cwd, env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        self._lock = threading.Lock()  # one request in flight at a time
        self._cond = threading.Condition()
        self._exits: dict[int, int] = {}  # children ended and not yet released, by pid
        self._reaped: set[int] = set()
        self._write_lock = threading.Lock()  # one message on the zygote's stdin at a time
        self._pids: list[int] = []
        self._reader = threading.Thread(target=self._read, name="tc-zygote-reader", daemon=True)
        self._reader.start()

    def alive(self) -> bool:
        return self._proc.poll() is None

    def fork(self, env: dict[str, str], cwd: Path, log: Path, target: str, kwargs_json: str, out: Path) -> ForkedRank:
        request = {"env": env, "cwd": str(cwd), "log": str(log), "target": target, "kwargs": kwargs_json,
                   "out": str(out), "cpus": sorted(os.sched_getaffinity(0))}
        with self._lock:
            with self._cond:
                known = len(self._pids)
            self._send(request)
            with self._cond:
                if not self._cond.wait_for(lambda: len(self._pids) > known or not self.alive(), 60):
                    raise RuntimeError("the rank zygote did not answer a fork request within 60 s")
                if len(self._pids) <= known:
                    raise RuntimeError(f"the rank zygote exited (rc={self._proc.returncode})")
                pid = self._pids[known]
        return ForkedRank(self, pid)

    def exit_code(self, pid: int, release: bool = False) -> int | None:
        """``pid``'s exit code, ``None`` while it runs; with ``release``, the zygote may now reap it,
        and the pid is forgotten (a later child may get it: its code must not be this one's)."""
        with self._cond:
            code = self._exits.pop(pid, None) if release else self._exits.get(pid)
        if release and code is not None:  # reaped before this returns, as Popen.poll() reaps
            self._send({"reap": pid})
            with self._cond:
                self._cond.wait_for(lambda: pid in self._reaped or not self.alive(), 10)
                self._reaped.discard(pid)
        return code

    def _send(self, message: dict[str, Any]) -> None:
        assert self._proc.stdin is not None
        with self._write_lock:
            try:
                self._proc.stdin.write(json.dumps(message).encode() + b"\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError):  # the zygote is gone: its children were reaped by init
                pass

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            msg = json.loads(line)
            with self._cond:
                if "pid" in msg:
                    self._pids.append(int(msg["pid"]))
                elif "reaped" in msg:
                    self._reaped.add(int(msg["reaped"]))
                else:
                    self._exits[int(msg["exit"])] = int(msg["code"])
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


#: variables a rank reads only after start-up (the library's settings, the rank's place, the
#: tests' own): ranks that differ only in these share a zygote. Any other difference (torch
#: reads some variables at import, e.g. TORCH_DISTRIBUTED_USE_TORCHCOMMS) gets a zygote of its own.
_READ_AFTER_START = ("TORCHCOMM_", "TC_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                     "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "PYTEST_")
#: zygotes kept per test process; the least recently used one is closed beyond this
_KEEP = 3

_ZYGOTES: dict[tuple[int, frozenset[tuple[str, str]], tuple[str, ...]], Zygote] = {}  # registry, in order of use
_ZYGOTES_LOCK = threading.Lock()


def _import_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(_READ_AFTER_START)}


def zygote_for(env: dict[str, str], cwd: Path, preload: tuple[str, ...] = ()) -> Zygote:
    """This test process's zygote for ranks with environment ``env`` that imported ``preload``
    (started on first use, restarted if it died): its own environment is ``env`` less the
    variables read after start-up."""
    base = _import_env(env)
    key = (os.getpid(), frozenset(base.items()), preload)
    with _ZYGOTES_LOCK:
        z = _ZYGOTES.pop(key, None)
        if z is None or not z.alive():
            z = Zygote(base, cwd, preload)
        _ZYGOTES[key] = z
        while len(_ZYGOTES) > _KEEP:
            _ZYGOTES.pop(next(iter(_ZYGOTES))).close()
        return z


# ----------------------------------------------------------------------------- the zygote itself

def _child(request: dict[str, Any]) -> None:
    """In the forked child: become the rank the request describes, run it, never return."""
    code = 1
    try:
        os.setsid()  # the zygote changed no signal disposition: the child has Python's own
        os.sched_setaffinity(0, request["cpus"])  # the caller's CPUs, as a process it started would have
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the rank's own stdin, /dev/null
        from tests.helpers import rank_main

        sys.argv = ["tests.helpers.rank_main", request["target"], request["kwargs"], request["out"]]
        code = rank_main.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child must never return into the zygote's loop
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _ended(children: set[int]) -> list[tuple[int, int]]:
    """The children that ended since the last call, with their exit codes, left unreaped
    (``WNOWAIT``): each stays a zombie, its pid taken, until the test side releases it."""
    ended = []
    for pid in list(children):
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            children.discard(pid)
            continue
        if info is not None and info.si_pid == pid:
            children.discard(pid)
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            ended.append((pid, code))
    return ended


def serve(preload: list[str]) -> None:
    """The zygote's loop: fork on each request, report each child's exit; ends at EOF (the test
    process is gone or done: its rank groups killed their children, and any left are orphans
    that their own session's ``killpg`` reaches, not the zygote)."""
    import importlib

    import torch  # noqa: F401 - what every rank would import first
    import torch.distributed  # noqa: F401

    import torchcomms  # noqa: F401
    from tests.helpers import rank_main  # noqa: F401

    for module in preload:
        importlib.import_module(module)

    out = os.fdopen(os.dup(1), "wb")
    children: set[int] = set()
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.02)
        if ready:
            chunk = os.read(0, 65536)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                request = json.loads(line)
                if "reap" in request:
                    try:
                        os.waitpid(int(request["reap"]), 0)  # a zombie: returns at once
                    except ChildProcessError:
                        pass
                    out.write(json.dumps({"reaped": int(request["reap"])}).encode() + b"\n")
                    out.flush()
                    continue
                out.flush()
                pid = os.fork()
                if pid == 0:
                    out.close()
                    _child(request)
                children.add(pid)
                out.write(json.dumps({"pid": pid}).encode() + b"\n")
                out.flush()
        for pid, code in _ended(children):
            out.write(json.dumps({"exit": pid, "code": code}).encode() + b"\n")
            out.flush()


if __name__ == "__main__":
    serve(sys.argv[1:])
