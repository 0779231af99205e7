"""What pyproject.toml names exists: console scripts and entry points resolve to a module of
the tree that defines the named object."""
from __future__ import annotations

import ast
import tomllib

import pytest

from tests.helpers.paths import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
TARGETS = [(f"script {k}", v) for k, v in PYPROJECT["scripts"].items()] + [
    (f"entry point {group}:{k}", v) for group, points in PYPROJECT.get("entry-points", {}).items() for k, v in points.items()
]


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


@pytest.mark.parametrize(("what", "target"), TARGETS, ids=[w for w, _ in TARGETS])
def test_target_exists(what: str, target: str) -> None:
    module, _, attr = target.partition(":")
    base = REPO.joinpath(*module.split("."))
    path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
    assert path.is_file(), f"{what} = {target!r}: module {module} is not in the tree"
    assert attr.split(".")[0] in _top_level_names(ast.parse(path.read_text())), f"{what} = {target!r}: {module} has no {attr}"


def test_the_trace_viewer_is_the_torchcomms_trace_command() -> None:
    assert PYPROJECT["scripts"]["torchcomms-trace"] == "torchcomms.tracing.viewer.cli:main"
