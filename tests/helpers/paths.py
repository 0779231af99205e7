"""Where the repository is, and the ``PYTHONPATH`` a child process of a test needs."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def child_pythonpath() -> str:
    """The repository first, then whatever this process's ``PYTHONPATH`` held (where the
    dependencies may live: carried wheels on the GPU machine, a ``--target`` install)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
