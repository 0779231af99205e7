"""The agent's side of the fork server (``--fork-server``, :mod:`launcher.fork_server`): start it,
ask it for workers, and supervise each as a child of the agent's own.

:meth:`ForkServer.spawn` has the signature of :func:`launcher.supervisor.spawn_process`, the seam
through which a :class:`~launcher.supervisor.WorkerGroup` starts its workers. It hands the server
the worker's environment, working directory and pipes; the server forks the worker and answers
its pid once the worker is the agent's child (the agent is the child subreaper of its
descendants, see :mod:`launcher.orphans`). :class:`ForkedProcess` then waits for it by pid as
``subprocess.Popen`` would: the existing supervision (reaping, exit status, signals by pid and
process group, the watcher's ``+PID``) is unchanged.

Whatever goes wrong with the server (it cannot import torch, it has a thread, it died, it did not
answer within :data:`REPLY_TIMEOUT_S`) is said once on the console, and every worker from then on
is a fresh interpreter again: the fork server only ever makes starts faster, never a job fail.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .fork_server import read_frame, write_frame
from .procfs import parent_of
from .supervisor import ProcessHandle, WorkerSpec, child_setup, spawn_process

__all__ = ["ForkServer", "ForkedProcess", "READY_TIMEOUT_S", "REPLY_TIMEOUT_S"]

_PROGRAM = str(Path(__file__).resolve().with_name("fork_server.py"))
#: how long the server may take to import torch before the agent starts workers without it
READY_TIMEOUT_S = 120.0
#: how long one fork may take to be answered
REPLY_TIMEOUT_S = 30.0


class ForkedProcess:
    """A worker forked by the server, a child of the agent: the part of ``subprocess.Popen`` that
    the supervisor uses."""

    def __init__(self, pid: int, stdout: IO[bytes] | None, stderr: IO[bytes] | None) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._lock = threading.Lock()  # one waitpid at a time: a pid is reaped once

    def _reap(self, flags: int) -> int | None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped already (cannot happen to a worker: nothing else waits by pid)
            pid, status = self.pid, 255 << 8
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)  # -N: killed by signal N, as Popen says
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:
                if self.returncode is None:
                    self._reap(os.WNOHANG)
            finally:
                self._lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None:
            deadline = time.monotonic() + timeout
            while (code := self.poll()) is None:
                if time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
                time.sleep(0.01)
            return code
        with self._lock:
            while self.returncode is None:
                self._reap(0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)


class ForkServerError(Exception):
    """The fork server cannot start this worker (said once; later workers start fresh)."""


class ForkServer:
    """One node's fork server. ``env`` is its environment: the workers' less their own variables
    (what is read at interpreter start and at torch's import must be theirs); ``say`` prints a
    console event. Start it from the agent's main thread, after the agent became a subreaper."""

    def __init__(self, python: str, env: dict[str, str], say: Callable[[str], None]) -> None:
        self._say = say
        self._broken: str | None = None
        self._ready = False
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(  # noqa: S603 - our own program
                [python, _PROGRAM], stdin=theirs, stdout=subprocess.DEVNULL, env=env,
                preexec_fn=child_setup(os.getpid()), close_fds=True)
        except BaseException:
            self._sock.close()
            raise
        finally:
            theirs.close()
        self.pid = self._proc.pid

    @property
    def serving(self) -> bool:
        """Workers are still forked by the server (it has not been given up)."""
        return self._broken is None

    def _answer(self, timeout: float) -> dict[str, object]:
        self._sock.settimeout(timeout)
        try:
            frame = read_frame(self._sock)
        except (OSError, ValueError) as exc:  # (socket.timeout is an OSError)
            raise ForkServerError(f"no answer within {timeout:g} s" if isinstance(exc, TimeoutError)
                                  else f"its answer could not be read: {exc}") from None
        if frame is None:
            raise ForkServerError(f"it exited (code {self._proc.wait()})")
        return frame[0]

    def _fork(self, spec: WorkerSpec) -> ForkedProcess:
        if not self._ready:
            said = self._answer(READY_TIMEOUT_S)
            if not isinstance(said.get("ready"), int):
                raise ForkServerError(str(said.get("error", said)))
            self._ready = True
        mode, target, args = spec.entry
        request = {"mode": mode, "target": target, "args": list(args), "env": spec.env,
                   "cwd": spec.cwd or os.getcwd()}
        null = os.open(os.devnull, os.O_RDONLY)
        pipes = [os.pipe(), os.pipe()] if spec.output is not None else []
        theirs = [null, *(w for _, w in pipes)] if pipes else [null, 1, 2]
        try:
            write_frame(self._sock, request, theirs)
        except OSError as exc:
            for r, _ in pipes:
                os.close(r)
            raise ForkServerError(f"it cannot be written to: {exc}") from None
        finally:
            for fd in (null, *(w for _, w in pipes)):
                os.close(fd)
        readers = [os.fdopen(r, "rb") for r, _ in pipes]
        said = self._answer(REPLY_TIMEOUT_S)
        pid = said.get("pid")
        ours = isinstance(pid, int) and pid > 0 and parent_of(pid) == os.getpid()
        if not ours:
            for f in readers:
                f.close()
        if not isinstance(pid, int) or pid <= 0:
            if "error" in said and "fork failed" in str(said["error"]):
                raise OSError(str(said["error"]))  # as Popen's failed fork: the start fails
            raise ForkServerError(str(said.get("error", said)))
        if not ours:  # (the worker itself exits when it is not the agent's child)
            raise ForkServerError(f"its worker {pid} is not this agent's child")
        return ForkedProcess(pid, *(readers or [None, None]))

    def spawn(self, spec: WorkerSpec, preexec_fn: Callable[[], None]) -> ProcessHandle:
        """Start ``spec``'s worker: forked by the server, or, once the server was given up, as a
        fresh interpreter (:func:`~launcher.supervisor.spawn_process`)."""
        if self._broken is None and spec.entry is not None:
            try:
                return self._fork(spec)
            except ForkServerError as exc:
                self._give_up(str(exc))
        return spawn_process(spec, preexec_fn)

    def _give_up(self, why: str) -> None:
        self._broken = why
        self._say(f"fork server (pid {self.pid}) given up: {why}; workers start as fresh interpreters")
        self.close()

    def close(self, wait_s: float = 2.0) -> None:
        """End the server: it exits at the end of its stream (SIGKILL if it does not)."""
        self._sock.close()
        try:
            self._proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()
