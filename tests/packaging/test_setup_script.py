"""scripts/setup.sh fails loudly, naming the step that failed, and is quiet when all works.

It runs on a copy of the script in a scratch tree, with ``id``, ``apt-get`` and ``python3``
replaced by stand-ins on ``PATH`` that log their calls and succeed or fail on demand, so
nothing is installed."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

STANDINS = {
    "id": 'echo "${FAKE_UID:-0}"',
    "apt-get": '''echo "apt-get $*" >> "$CALLS"
case "$1" in
  update) [ "${FAKE_APT:-ok}" != update-fails ] || { echo "E: The repository is not signed." >&2; exit 100; } ;;
  install)
    if [ -n "${FAKE_APT_UNTIL:-}" ]; then  # ends once that call was made (or after 10 s)
      i=0; while ! grep -qF "$FAKE_APT_UNTIL" "$CALLS" && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
      echo "apt-get install ends" >> "$CALLS"
    fi
    [ "${FAKE_APT:-ok}" != install-fails ] || { echo "E: Unable to locate package fakepkg" >&2; exit 100; }
    [ "${FAKE_APT:-ok}" = installs-nothing ] || { printf '#!/bin/sh\\n' > "$BIN/fakecmd"; chmod +x "$BIN/fakecmd"; } ;;
esac''',
    "python3": '''echo "python3 $*" >> "$CALLS"
if [ "$1 $2" = "-m pip" ]; then
  echo "Collecting torch==2.13.0"
  [ "${FAKE_PIP:-ok}" = ok ] || { echo "ERROR: No matching distribution found for torch==2.13.0" >&2; exit 1; }
elif [ "$1" = -c ]; then
  [ "${FAKE_IMPORT:-ok}" = ok ] || { echo "AssertionError: torch 2.11.0 is installed, the project pins 2.13.0" >&2; exit 1; }
fi''',
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    for script in ("setup.sh", "byte_compile.sh"):
        shutil.copy(REPO / "scripts" / script, tmp_path / "scripts" / script)
    (tmp_path / "scripts" / "apt-packages.txt").write_text("# package command\nfakepkg fakecmd\n")
    (tmp_path / "bin").mkdir()
    for name, body in STANDINS.items():
        p = tmp_path / "bin" / name
        p.write_text("#!/bin/sh\n" + body + "\n")
        p.chmod(0o755)
    return tmp_path


def _run(tree: Path, **fake: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{tree / 'bin'}:/usr/bin:/bin", "HOME": str(tree), "CALLS": str(tree / "calls"),
           "BIN": str(tree / "bin"), **fake}
    return subprocess.run(["bash", str(tree / "scripts" / "setup.sh")], env=env, capture_output=True, text=True, timeout=60)


def _calls(tree: Path) -> list[str]:
    """The stand-ins' calls, one line each (a ``python3 -c`` script's later lines dropped)."""
    lines = (tree / "calls").read_text().splitlines() if (tree / "calls").exists() else []
    return [c for c in lines if c.split(" ", 1)[0] in STANDINS]


def test_quiet_on_success_and_idempotent(tree: Path) -> None:
    first = _run(tree)
    assert (first.returncode, first.stdout, first.stderr) == (0, "", "")
    calls = [c.split()[:2] for c in _calls(tree)]
    assert [c for c in calls if c[0] == "apt-get"] == [["apt-get", "update"], ["apt-get", "install"]]
    assert [c for c in calls if c[0] == "python3"] == [["python3", "-m"], ["python3", "-c"], ["python3", "-m"],
                                                        ["python3", "-m"]]
    (tree / "calls").unlink()
    again = _run(tree)  # fakecmd exists now: apt is not touched again
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")
    assert [c.split()[0] for c in _calls(tree)] == ["python3"] * 4


def test_a_failed_pip_fails_the_script_and_names_it(tree: Path) -> None:
    res = _run(tree, FAKE_PIP="fail")
    assert res.returncode == 1
    assert "setup.sh: pip install of torch==2.13.0 and this project with its test extras failed (exit 1)" in res.stderr
    assert "No matching distribution found for torch==2.13.0" in res.stderr
    assert not any(c.startswith("python3 -c") for c in _calls(tree))  # it stopped there


@pytest.mark.parametrize(("fake_apt", "says"), [
    ("update-fails", ["setup.sh: apt-get update failed (exit 100)", "The repository is not signed."]),
    ("install-fails", ["setup.sh: apt-get install of fakepkg failed (exit 100)", "Unable to locate package fakepkg"]),
    ("installs-nothing", ["Debian package fakepkg installed but its command fakecmd is still missing"]),
])
def test_apt_errors_are_shown_and_stop_the_script(tree: Path, fake_apt: str, says: list[str]) -> None:
    res = _run(tree, FAKE_APT=fake_apt)
    assert res.returncode != 0
    for line in says:
        assert line in res.stderr


def test_debian_packages_install_beside_pip_and_the_script_waits_for_them(tree: Path) -> None:
    """apt-get (network and disk) runs while pip installs, the C++ extension builds and the tree is
    byte-compiled; the script ends only after it, also when a step of its own failed first."""
    ok = _run(tree, FAKE_APT_UNTIL="python3 -m compileall")
    assert ok.returncode == 0, ok.stderr
    calls = [c for c in (tree / "calls").read_text().splitlines() if c.split(" ", 1)[0] in STANDINS]
    assert calls.index("apt-get install ends") == len(calls) - 1  # after the last step: it ran beside them
    assert calls.index("python3 -m pip install -q torch==2.13.0 -e .[test,mpi]") < calls.index("apt-get install ends")
    (tree / "calls").unlink()
    (tree / "bin" / "fakecmd").unlink()
    failed = _run(tree, FAKE_APT_UNTIL="python3 -m pip", FAKE_PIP="fail")
    assert failed.returncode == 1
    assert "setup.sh: pip install of torch==2.13.0 and this project with its test extras failed" in failed.stderr
    assert (tree / "calls").read_text().splitlines()[-1] == "apt-get install ends"  # waited for, not left behind


def test_a_broken_install_is_caught_by_the_check(tree: Path) -> None:
    res = _run(tree, FAKE_IMPORT="fail")
    assert res.returncode == 1
    assert "setup.sh: checking the install" in res.stderr and "the project pins 2.13.0" in res.stderr


def test_without_root_it_says_what_it_did_not_install(tree: Path) -> None:
    res = _run(tree, FAKE_UID="1000")
    assert res.returncode == 0
    assert "not installing Debian packages fakepkg" in res.stderr
    assert not any(c.startswith("apt-get") for c in _calls(tree))


def test_the_real_package_list_names_a_command_per_package() -> None:
    for line in (REPO / "scripts" / "apt-packages.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert len(line.split()) == 2, f"apt-packages.txt: {line!r} should be 'package command'"
