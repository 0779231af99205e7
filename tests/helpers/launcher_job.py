"""Run a ``torchcomms-run`` job from a test: its whole output, and its exit code or ``None``
when it outlived its limit (then the whole job, launcher and workers, is killed)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.helpers.paths import REPO


def run_launcher_job(launcher_args: list[str], env: dict[str, str], limit_s: float) -> tuple[int | None, str]:
    """``python -m launcher *launcher_args`` in a session of its own; ``(returncode, output)``."""
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *launcher_args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit_s)
        return proc.returncode, out.decode(errors="replace")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out.decode(errors="replace")
