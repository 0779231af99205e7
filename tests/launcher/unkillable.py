"""A stand-in for a worker in uninterruptible sleep (state D), and an agent that has one.

A real D-state process (stuck in a hung NFS or GPU driver call) cannot be made portably in a
test, so :class:`UnkillableProcess` fakes what the agent sees of one, at the process-spawning
seam (``launcher.supervisor.spawn_process``): the worker's command really runs (its pid and
``/proc/<pid>/stat`` are real), but in the caller's process group rather than one of its own,
so the agent's group signals miss it; signals sent to the handle are dropped, and
``wait()``/``poll()`` never report an exit until :meth:`UnkillableProcess.release` (the
kernel lets it go).

Run as a script, it is ``torchcomms-run`` (the real agent, in this process) whose rank
``$UNKILLABLE_RANK`` is such a process in the attempts listed in ``$UNKILLABLE_ATTEMPTS``
(default ``0``); ``$KILL_WAIT_S`` shortens the agent's wait after SIGKILL. The fake worker's
pid is printed to stderr as ``[unkillable] rank R pid P``. It dies with this process
(``PR_SET_PDEATHSIG``). Before each worker is started, the agent's live output reader threads
are counted: ``[unkillable] attempt A rank R: N output readers alive``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import IO, Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the forked child, before exec
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


class UnkillableProcess:
    """A worker process that ignores every signal and whose exit is never seen (see above)."""

    def __init__(self, spec: Any, preexec_fn: Any = None) -> None:
        pipe = subprocess.PIPE if spec.output is not None else None
        self._proc = subprocess.Popen(  # noqa: S603
            list(spec.argv), env=spec.env, cwd=spec.cwd, stdin=subprocess.DEVNULL,
            stdout=pipe, stderr=pipe, preexec_fn=_die_with_parent, close_fds=True)
        self.pid: int = self._proc.pid
        self.stdout: IO[bytes] | None = self._proc.stdout
        self.stderr: IO[bytes] | None = self._proc.stderr
        self.signals: list[int] = []
        self._released = threading.Event()

    def poll(self) -> int | None:
        return self._proc.returncode if self._released.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._released.wait(timeout):
            raise subprocess.TimeoutExpired(self._proc.args, timeout or 0.0)
        return self._proc.wait()

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)  # dropped, as a process in D state defers them

    def release(self) -> None:
        """The uninterruptible sleep ends: the pending SIGKILL takes effect."""
        self._proc.kill()
        self._proc.wait()
        self._released.set()


def main() -> int:
    import launcher.supervisor as sup
    from launcher.cli import main as torchcomms_run

    rank = int(os.environ["UNKILLABLE_RANK"])
    attempts = os.environ.get("UNKILLABLE_ATTEMPTS", "0").split(",")
    if "KILL_WAIT_S" in os.environ:
        sup.KILL_WAIT_S = float(os.environ["KILL_WAIT_S"])
    real_spawn = sup.spawn_process

    def spawn(spec: Any, preexec_fn: Any) -> Any:
        attempt = spec.env.get("TORCHELASTIC_RESTART_COUNT")
        readers = sum(t.name.startswith("output-") for t in threading.enumerate())
        print(f"[unkillable] attempt {attempt} rank {spec.placement.rank}: {readers} output "
              f"readers alive", file=sys.stderr, flush=True)
        if spec.placement.rank == rank and attempt in attempts:
            proc = UnkillableProcess(spec)
            print(f"[unkillable] rank {rank} pid {proc.pid}", file=sys.stderr, flush=True)
            return proc
        return real_spawn(spec, preexec_fn)

    sup.spawn_process = spawn
    return torchcomms_run(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
