"""Run a test script under Triton's CPU interpreter, in a subprocess (``TRITON_INTERPRET`` is
read when kernels are defined, so it cannot be switched on inside the test process)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None


def run_interpreted(script: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with ``TRITON_INTERPRET=1`` and the repository importable; CPU only."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def assert_runs_interpreted(script: str, expect: str | None = "ok") -> subprocess.CompletedProcess[str]:
    """Run ``script`` under the interpreter and assert it exited 0 (its output's tail is the
    failure message) and, unless ``expect`` is None, printed ``expect``."""
    proc = run_interpreted(script)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    if expect is not None:
        assert expect in proc.stdout
    return proc
