"""Every package the code imports is declared in pyproject.toml, where an install gets it."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tests.packaging._imports import distributions_for, requirement_name, third_party_needs

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
CORE = {requirement_name(r) for r in PROJECT["dependencies"]}
EXTRAS = {name: {requirement_name(r) for r in reqs} for name, reqs in PROJECT["optional-dependencies"].items()}
ALL_EXTRAS = set().union(*EXTRAS.values())
NON_TEST_EXTRAS = set().union(*(reqs for name, reqs in EXTRAS.items() if name != "test"))


def shipped_packages() -> list[str]:
    """Top-level folders that pyproject's ``packages.find`` patterns pick up and that exist."""
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()
                  and any(p.name == pat.rstrip("*") for pat in patterns))


def _files(*folders: str) -> list[Path]:
    return sorted(f for d in folders if (REPO / d).exists() for f in (REPO / d).rglob("*.py"))


def _undeclared(folders: tuple[str, ...], allowed: set[str], *, unguarded_allowed: set[str] | None = None) -> list[str]:
    bad = []
    for need in third_party_needs(_files(*folders), REPO):
        ok = allowed if not need.unguarded or unguarded_allowed is None else unguarded_allowed
        if not distributions_for(need.name) & ok:
            bad.append(f"{need.where}: {need.name}")
    return sorted(set(bad))


def test_shipped_packages_are_found() -> None:
    assert {"torchcomms", "launcher", "kernels"} <= set(shipped_packages())


def test_shipped_packages_import_only_what_an_install_brings() -> None:
    # a module-level import must come with a plain `pip install torchcomms`; a guarded or lazy
    # one (optional engines, Triton) with one of the user-facing extras
    assert _undeclared(tuple(shipped_packages()), CORE | NON_TEST_EXTRAS, unguarded_allowed=CORE) == []


@pytest.mark.parametrize(("folders", "extras"), [
    (("tests",), ALL_EXTRAS),
    (("benchmarks",), NON_TEST_EXTRAS),
    (("examples", "docker"), NON_TEST_EXTRAS),
])
def test_scripts_import_only_declared_packages(folders: tuple[str, ...], extras: set[str]) -> None:
    assert _undeclared(folders, CORE | extras) == []


def test_the_scan_sees_what_it_must(tmp_path: Path) -> None:
    # beside import statements, the scan counts Tensor.numpy() calls and scripts in strings as needs
    script = tmp_path / "runs_a_script.py"
    script.write_text('SCRIPT = """\nimport numpy as np\nprint(np.zeros(1))\n"""\n')
    needs = third_party_needs([REPO / "kernels" / "attention" / "masks.py"], REPO) + third_party_needs([script], tmp_path)
    assert {(n.where, n.name) for n in needs if n.name == "numpy"} == {
        ("kernels/attention/masks.py", "numpy"), ("runs_a_script.py", "numpy")}
    assert "numpy" in CORE


def test_every_shipped_package_has_py_typed_and_pyproject_installs_it() -> None:
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data.get("*", [])
    assert [p for p in shipped_packages() if not (REPO / p / "py.typed").is_file()] == []
