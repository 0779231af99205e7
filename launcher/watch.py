"""The agent's side of its watcher (:mod:`launcher.watcher`): start it, tell it the workers it
starts and ends, and let it go at a normal exit.

The watcher holds the read end of a pipe whose only write end is the agent's (close-on-exec, so
no worker inherits it): the pipe closes when the agent dies, however it dies, and the watcher
then kills every process of the agent's workers. Writes never block the agent: a watcher that
cannot keep up (stopped) loses a message rather than stalling the job.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

from .watcher import MARK_VAR

__all__ = ["Watch", "MARK_VAR"]

_PROGRAM = str(Path(__file__).resolve().with_name("watcher.py"))


class Watch:
    """A started watcher. ``mark`` is the value of ``MARK_VAR`` to set in every worker's
    environment; ``pid`` the watcher's process (a child of the agent, which must not end it
    with the orphans it adopted)."""

    def __init__(self, python: str | None = None) -> None:
        self.mark = secrets.token_hex(8)
        read, self._write = os.pipe()  # both close-on-exec: only the watcher gets the read end
        try:
            self._proc = subprocess.Popen(  # noqa: S603 - our own program
                [python or sys.executable, "-I", "-S", _PROGRAM, self.mark], stdin=read,
                stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        except BaseException:
            os.close(self._write)
            raise
        finally:
            os.close(read)
        os.set_blocking(self._write, False)
        self.pid = self._proc.pid

    def _send(self, line: str) -> None:
        if self._write < 0:
            return
        try:
            os.write(self._write, f"{line}\n".encode())
        except OSError:  # the watcher is gone or stopped: the job runs on without it
            pass

    def add(self, pid: int) -> None:
        """A worker (the leader of its own process group) was started."""
        self._send(f"+{pid}")

    def drop(self, pid: int) -> None:
        """A worker was reaped and its group ended: its pid may name another process from now on."""
        self._send(f"-{pid}")

    def remove_at_death(self, folder: str) -> None:
        """Should the agent die, the watcher removes ``folder`` (one line: no newline in its name)."""
        if "\n" not in folder:
            self._send(f"@{folder}")

    def close(self, wait_s: float = 2.0) -> None:
        """The agent exits normally: the watcher ends without killing anything."""
        if self._write < 0:
            return
        self._send("exit")
        os.close(self._write)
        self._write = -1
        try:
            self._proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:  # it read the pipe's end: it exits by itself
            pass
