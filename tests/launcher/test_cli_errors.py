"""What the shell sees for a command line that cannot run: one ``error:`` line, no
traceback, and an exit code that says why."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO, base_env, run_launcher


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


@pytest.mark.parametrize("module", ["missing_mod_x1", "missing_pkg_x1.train"])
def test_a_module_that_cannot_be_found_is_one_line_before_any_worker_starts(module):
    """Every worker used to start and fail with Python's ``No module named``."""
    proc = run_launcher("--nproc-per-node", "2", "-m", module, timeout=60)
    assert proc.returncode == 2, proc.stderr
    top = module.split(".")[0]
    assert proc.stderr.startswith(f"[torchcomms-run] error: -m {module}: no module named {top!r} (looked in the "
                                  f"working directory {REPO}, PYTHONPATH and the paths of "), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not proc.stdout, proc.stderr + proc.stdout


#: -m NAME -> what the job does: "ran" (every worker ran it), "refused" (the launcher, before any
#: worker starts) or "workers" (every worker starts and reports Python's own error)
_MODULES = {
    "in_cwd_x1": "ran",
    "on_path_x1": "ran",
    "on_path_pkg_x1.train": "ran",
    "on_path_pkg_x1.sub_x1.leaf": "ran",
    "on_path_pkg_x1.missing_x1": "refused",
    "on_path_pkg_x1.sub_x1.missing_x1": "refused",
    "on_path_pkg_x1.missing_x1.leaf": "refused",
    "extends_path_x1.missing_x1": "workers",
}


@pytest.mark.parametrize("module", list(_MODULES))
def test_a_module_is_looked_up_on_the_workers_path_without_running_it(tmp_path, module):
    """The launcher, started like a console script and ignoring PYTHONPATH (``-E -P``), has neither
    the working directory nor PYTHONPATH on its own path: the workers, plain ``python -m``, do. A
    missing submodule is refused before any worker starts, unless its package's ``__init__`` may
    change where submodules are found. A package's ``__init__`` runs in the workers only."""
    lib = tmp_path / "lib"
    (lib / "on_path_pkg_x1" / "sub_x1").mkdir(parents=True)
    (lib / "extends_path_x1").mkdir()
    say = "import os\nprint('ran', __name__, os.environ['RANK'])\n"
    mark = "import os, pathlib\npathlib.Path(os.environ['MARKS'], str(os.getpid())).write_text('')\n"
    (tmp_path / "in_cwd_x1.py").write_text(say)
    (lib / "on_path_x1.py").write_text(say)
    (lib / "on_path_pkg_x1" / "__init__.py").write_text(mark)
    (lib / "on_path_pkg_x1" / "train.py").write_text(say)
    (lib / "on_path_pkg_x1" / "sub_x1" / "__init__.py").write_text("")
    (lib / "on_path_pkg_x1" / "sub_x1" / "leaf.py").write_text(say)
    (lib / "extends_path_x1" / "__init__.py").write_text(mark + "__path__.append(os.environ['MARKS'])\n")
    marks = tmp_path / "marks"
    marks.mkdir()
    # the launcher's own path: the repository and where this interpreter finds the launcher's
    # dependencies (a machine may hold them on PYTHONPATH, which -E drops), never cwd or lib
    own = [str(REPO)] + [p for p in sys.path if p and os.path.isabs(p) and not p.startswith(str(tmp_path))]
    main = f"import sys; sys.path[:0] = {own!r}; from launcher.cli import main; sys.exit(main())"
    env = base_env(PYTHONPATH=os.pathsep.join([str(REPO), "lib"]), MARKS=str(marks))
    proc = subprocess.run([sys.executable, "-E", "-P", "-c", main, "--nproc-per-node", "2", "--no-summary",
                           "-m", module], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    ran_init = sorted(int(p.name) for p in marks.iterdir())
    outcome = _MODULES[module]
    if outcome == "refused":
        assert proc.returncode == 2, proc.stderr
        missing = ".".join(module.split(".")[:-1 if module.endswith(".leaf") else None])
        parent = missing.rpartition(".")[0]
        where = lib.joinpath(*parent.split("."))
        assert proc.stderr == (f"[torchcomms-run] error: -m {module}: no module named {missing!r} "
                               f"(looked in the package {parent!r}: {where})\n"), proc.stderr
        assert not proc.stdout and ran_init == [], proc.stdout
    elif outcome == "workers":
        assert proc.returncode not in (0, 2), proc.stderr
        # the first worker to fail stops the job: the other may be stopped before it reports
        assert f"No module named {module}" in proc.stderr and ran_init, proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert sorted(line.split("] ", 1)[1] for line in proc.stdout.splitlines()) == [
            f"ran __main__ {rank}" for rank in (0, 1)], proc.stdout
        assert len(ran_init) == (2 if "pkg" in module else 0), ran_init
