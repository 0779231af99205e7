"""The C++ extension's build under concurrent and killed builders (``torchcomms.csrc.build``):
a builder killed mid-build (its torch lock file left behind) does not block the next one, and
waiting for a live builder ends at the build timeout with an error naming it."""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO, child_pythonpath
from torchcomms.csrc import build

_LOAD = "from torchcomms.csrc import build; build.load(); print('loaded')"
HANG_S = 120  # a build from an up-to-date cache takes seconds; a hung one never returns


def _cache_copy(tmp_path: Path) -> Path:
    """A copy of this machine's finished build (made now if missing) without its done mark, under
    ``tmp_path`` as the cache root: a build there is up to date and only links and loads."""
    source = build.cache_dir()
    if not (source / "build.ok").exists():
        subprocess.run([sys.executable, "-m", "torchcomms.csrc.build"], cwd=REPO, check=True, timeout=900,
                       env=dict(os.environ, PYTHONPATH=child_pythonpath()))
    target = tmp_path / source.name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("build.ok", "lock", "build.flock"))
    return target


def _load(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYTHONPATH=child_pythonpath(), TORCHCOMMS_EXTENSIONS_DIR=str(root), **env)
    return subprocess.run([sys.executable, "-c", _LOAD], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=HANG_S)


def test_a_lock_file_left_by_a_killed_builder_does_not_block_the_next(tmp_path: Path) -> None:
    entry = _cache_copy(tmp_path)
    (entry / "lock").write_text("")  # what torch's build leaves when its process is SIGKILLed
    out = _load(tmp_path)
    assert out.returncode == 0 and "loaded" in out.stdout, out.stderr[-3000:]
    assert (entry / "build.ok").exists()
    assert not (entry / "lock").exists()


def test_waiting_for_a_live_builder_ends_at_the_build_timeout_naming_it(tmp_path: Path) -> None:
    entry = _cache_copy(tmp_path)
    with open(entry / "build.flock", "w") as held:  # this process builds, as far as the child knows
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242\n")
        held.flush()
        out = _load(tmp_path, TORCHCOMM_EXTENSION_BUILD_TIMEOUT_S="1")
    assert out.returncode != 0
    assert "ExtensionBuildTimeout" in out.stderr and "process 4242" in out.stderr, out.stderr[-3000:]
    assert "TORCHCOMM_EXTENSION_BUILD_TIMEOUT_S" in out.stderr
    out = _load(tmp_path)  # the lock released: the build goes ahead
    assert out.returncode == 0 and "loaded" in out.stdout, out.stderr[-3000:]


def test_a_bad_build_timeout_is_refused_by_name(tmp_path: Path) -> None:
    out = _load(tmp_path, TORCHCOMM_EXTENSION_BUILD_TIMEOUT_S="soon")
    assert out.returncode != 0 and "TORCHCOMM_EXTENSION_BUILD_TIMEOUT_S" in out.stderr and "'soon'" in out.stderr
