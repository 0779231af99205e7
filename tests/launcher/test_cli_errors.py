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


@pytest.mark.parametrize("how", ["script", "run-path"])
def test_a_missing_script_is_one_line_before_any_worker_starts(tmp_path, how):
    """Every worker used to start, fail with Python's own ``can't open file`` and fill a summary."""
    script = tmp_path / "missing.py"
    extra = ["--run-path"] if how == "run-path" else []
    proc = run_launcher("--nproc-per-node", "2", *extra, str(script), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"[torchcomms-run] error: the entry point {str(script)!r} does not exist", proc.stderr


def test_a_log_dir_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    log_dir = tmp_path / "file" / "logs"
    proc = run_launcher("--log-dir", str(log_dir), "-m", "json.tool", "--help", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"[torchcomms-run] error: --log-dir {str(log_dir)!r}: cannot create "), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
