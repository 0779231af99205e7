"""The library's shape: no import cycle between its modules, small modules in the communicator's
packages, and no private name of one class used from another module."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "torchcomms"
LAUNCHER = PKG.parent / "launcher"
#: the packages this layout test holds to the ~400-line rule (tracing/ has its own)
SMALL = ("core", "recovery", "setup", "control")
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _top_level_imports(path: Path) -> set[str]:
    """torchcomms modules imported when ``path`` is imported (not under TYPE_CHECKING, not
    inside functions)."""
    out: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    body = [n for n in tree.body if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))]
    for node in body:
        for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ():
            if isinstance(sub, ast.Import):
                out |= {a.name for a in sub.names if a.name.startswith("torchcomms")}
            elif isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("torchcomms"):
                for a in sub.names:
                    full = f"{sub.module}.{a.name}"
                    out.add(full if full in MODULES else sub.module)
    return {m for m in out if m in MODULES}


LAUNCHER_MODULES = {_module_name(p): p for p in LAUNCHER.glob("*.py")}


def _launcher_imports(path: Path) -> set[str]:
    """launcher modules imported at the top of ``path`` (relative or absolute imports)."""
    out: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom):
            base = "launcher" if node.level == 1 else (node.module or "").split(".")[0]
            module = f"launcher.{node.module}" if node.level == 1 and node.module else node.module
            if base == "launcher" and module:
                out.add(module)
                out |= {f"{module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in LAUNCHER_MODULES}


@pytest.mark.parametrize("package", ("torchcomms", "launcher"))
def test_no_import_cycle_between_modules(package: str) -> None:
    if package == "torchcomms":
        graph = {name: _top_level_imports(path) - {name} for name, path in MODULES.items()}
    else:
        graph = {name: _launcher_imports(path) - {name} for name, path in LAUNCHER_MODULES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            # a package's __init__ importing its own submodules is a re-export, not a cycle
            real = [m for m in comp if not any(o != m and o.startswith(m + ".") for o in comp)]
            if len(real) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []


@pytest.mark.parametrize("package", SMALL)
def test_modules_are_small(package: str) -> None:
    big = {str(p.relative_to(PKG)): n for p in (PKG / package).rglob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert big == {}
    assert len((PKG / "config.py").read_text(encoding="utf-8").splitlines()) <= MAX_LINES


def test_launcher_modules_are_small() -> None:
    big = {p.name: n for p in LAUNCHER.glob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert big == {}


#: reaching into private names that are not another class's of ours: the same class's other
#: instance, or the standard library's
_ALLOWED = {("core/comm.py", "comm._core"), ("core/types.py", "other._type"), ("core/types.py", "other._factor"),
            ("core/comm_core.py", "os._exit"),
            ("../launcher/supervisor.py", "os._exit"), ("../launcher/fork_server.py", "os._exit"),
            ("../launcher/fork_server.py", "runpy._run_module_as_main"),  # what `python -m` runs
            ("../launcher/parser.py", "parser._option_string_actions"),  # argparse has no public accessor
            ("setup/bootstrap.py", "dist.distributed_c10d._get_default_store")}  # nor c10d of its default store


def test_no_private_name_of_another_object_is_used() -> None:
    found = []
    paths = [p for package in SMALL for p in (PKG / package).rglob("*.py")] + sorted(LAUNCHER.glob("*.py"))
    for path in paths:
        rel = os.path.relpath(path, PKG)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                text = ast.unparse(node)
                if (rel, text) not in _ALLOWED:
                    found.append(f"{rel}:{node.lineno}: {text}")
    assert found == []
