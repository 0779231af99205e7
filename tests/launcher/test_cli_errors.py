"""What the shell sees for a command line that cannot run: one ``error:`` line, no
traceback, and an exit code that says why."""

from __future__ import annotations

import pytest

from conftest import run_launcher


@pytest.mark.parametrize("argv", [["--nproc-per-node", "2"], ["--nproc-per-node", "2", "--"], ["-m"]])
def test_missing_entry_point_is_named_plainly(argv):
    proc = run_launcher(*argv, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "entrypoint_args" not in proc.stderr, proc.stderr
    assert "error: no entry point: torchcomms-run [options] SCRIPT [SCRIPT ARGS...]" in proc.stderr, proc.stderr
