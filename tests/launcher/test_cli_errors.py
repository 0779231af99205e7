"""What the shell sees for a command line that cannot run: one ``error:`` line, no
traceback, and an exit code that says why."""

from __future__ import annotations

import os

import pytest

from conftest import run_launcher


@pytest.mark.parametrize("executable", [False, True], ids=["not-executable", "missing"])
def test_no_python_entry_point_that_cannot_run(tmp_path, executable):
    script = tmp_path / "train.py"
    if not executable:
        script.write_text("print('hi')\n")
        os.chmod(script, 0o644)
    proc = run_launcher("--nproc-per-node", "2", "--no-python", str(script), timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"error: cannot start rank 0's worker '{script}'" in proc.stderr, proc.stderr
    assert proc.returncode == (126 if not executable else 127), proc.stderr


@pytest.mark.parametrize("argv", [["--nproc-per-node", "2"], ["--nproc-per-node", "2", "--"], ["-m"]])
def test_missing_entry_point_is_named_plainly(argv):
    proc = run_launcher(*argv, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "entrypoint_args" not in proc.stderr, proc.stderr
    assert "error: no entry point: torchcomms-run [options] SCRIPT [SCRIPT ARGS...]" in proc.stderr, proc.stderr
