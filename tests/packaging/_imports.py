"""Static scan of the third-party packages a tree of Python files needs (no import runs).

Besides ``import`` statements it reads the Python scripts that tests and benchmarks keep in
string literals (run through ``python -c``), and counts ``Tensor.numpy()`` calls as a need
for numpy, which torch imports only when that method runs.
"""
from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib.metadata import packages_distributions
from pathlib import Path

# Import names whose distribution is called something else, for packages that may not be
# installed where the scan runs (installed ones are looked up in their metadata).
KNOWN_DISTRIBUTIONS = {
    "zmq": {"pyzmq"},
    "yaml": {"pyyaml"},
    "opentelemetry": {"opentelemetry-sdk", "opentelemetry-api"},
}


@dataclass(frozen=True)
class Need:
    """One third-party import: its top-level name, where, and whether a clean install without
    extras would hit it (a module-level import outside ``try``/``if``)."""

    name: str
    where: str
    unguarded: bool


def normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def requirement_name(req: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    assert m, f"cannot read a distribution name from {req!r}"
    return normalise(m.group(1))


@cache
def _installed() -> dict[str, list[str]]:
    return packages_distributions()


def distributions_for(import_name: str) -> set[str]:
    """The distributions that may provide ``import_name``."""
    found = {normalise(d) for d in _installed().get(import_name, [])}
    return found | KNOWN_DISTRIBUTIONS.get(import_name, set()) | {normalise(import_name)}


def _imports(tree: ast.AST) -> Iterator[tuple[str, bool]]:
    """(top-level module name, at module level) for each absolute import in ``tree``."""
    top = set(map(id, getattr(tree, "body", [])))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            yield name.split(".")[0], id(node) in top


def _embedded_scripts(tree: ast.AST) -> Iterator[ast.AST]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
            try:
                yield ast.parse(node.value)
            except SyntaxError:
                continue


def _calls_numpy_method(tree: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "numpy" and not n.args
        for n in ast.walk(tree)
    )


def third_party_needs(files: list[Path], repo: Path) -> list[Need]:
    """Every third-party import of ``files``; modules of the repository (top-level folders, and
    files beside a script or in a folder above it, which scripts import by path) are not counted."""
    local = {p.stem for p in repo.iterdir() if p.suffix == ".py" or (p.is_dir() and not p.name.startswith("."))}
    needs: list[Need] = []
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        beside = {p.stem for d in path.parents if d == repo or repo in d.parents for p in d.iterdir()}
        where = str(path.relative_to(repo))
        found = list(_imports(tree))
        found += [(name, False) for script in _embedded_scripts(tree) for name, _ in _imports(script)]
        if _calls_numpy_method(tree):
            found.append(("numpy", False))
        for name, at_top in found:
            if name in sys.stdlib_module_names or name in local or name in beside:
                continue
            needs.append(Need(name, where, at_top))
    return needs
