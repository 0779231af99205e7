"""Every folder of tests is collected by the README's test command (``pytest ... tests``).

pytest skips folders whose name matches ``norecursedirs``; its default list holds ``dist``, so
``tests/dist`` (the torch.distributed route's 39 tests) never ran in the suite until
``pyproject.toml`` set its own list."""
from __future__ import annotations

import fnmatch
import tomllib

from tests.helpers.paths import REPO


#: pytest's own ``norecursedirs`` (pytest 8 and 9), used where pyproject sets none
PYTEST_DEFAULT = ["*.egg", ".*", "_darcs", "build", "CVS", "dist", "node_modules", "venv", "{arch}"]


def test_no_folder_of_tests_is_left_out_by_norecursedirs() -> None:
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    patterns = ini.get("norecursedirs", PYTEST_DEFAULT)
    folders = {f.parent for f in (REPO / "tests").rglob("test_*.py")}
    left_out = sorted(str(d.relative_to(REPO)) for d in folders
                      for part in d.relative_to(REPO / "tests").parts
                      if any(fnmatch.fnmatch(part, pat) for pat in patterns))
    assert not left_out, f"pytest would not collect {left_out} (norecursedirs {patterns})"
    assert (REPO / "tests" / "dist") in folders
