"""Whether the workers' ``python -m NAME`` can find ``NAME``, asked without running any of it.

The top-level name (``pkg`` of ``pkg.sub.leaf``) is looked up by the finders of
:data:`sys.meta_path` of the launcher's own interpreter, which is the workers', so the finders
installed at start-up count (an editable install's, zip imports, built-in and frozen modules),
with the workers' search path in front of the launcher's: their working directory (``python -m``
puts it first) and the entries of their ``PYTHONPATH``.

Importing ``pkg`` to find ``pkg.sub`` would run its ``__init__`` (anything: torch, user code), so
submodules are found as the import system would find them after it, level by level: every finder
of :data:`sys.meta_path` asked for ``pkg.sub`` with the parent's ``submodule_search_locations``
from its spec. That static walk says a submodule is missing only when its parent cannot change
where submodules are found: the parent was found by :class:`~importlib.machinery.PathFinder` and
is a namespace package or a source file whose text mentions none of :data:`_DYNAMIC` (``__path__``
of course; ``sys.modules`` because a module put there is found without any finder, as ``os``
does for ``os.path``). Anything else (a zip import, an extension module, a frozen or built-in
module, a module only a third-party finder knows, a bytecode-only package, a namespace package
inside another, which PathFinder finds only below an imported parent) ends the walk with the
module taken as found: its workers say what is wrong. A name is so never refused that a worker
could import. The walk reads the parents' ``__init__`` only: one that imports another module which
puts ``pkg.sub`` into ``sys.modules`` is not seen.
"""
from __future__ import annotations

import importlib.machinery
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.machinery import ModuleSpec

__all__ = ["Missing", "find_missing", "search_path"]

#: Text in a package's source by which it may change where its submodules are found (its
#: ``__path__``, the import system's finders and caches, ``sys.modules``, a module ``__getattr__``)
_DYNAMIC = re.compile(rb"__path__|pkgutil|extend_path|meta_path|path_hooks|path_importer_cache|__getattr__"
                      rb"|\.modules\b|\bfrom\s+sys\s+import\b")

_NAMESPACE_LOADER = getattr(importlib.machinery, "NamespaceLoader", None)  # Python >= 3.11


@dataclass(frozen=True)
class Missing:
    """The first name of ``-m NAME`` the workers cannot find, and where it was looked for."""

    name: str
    detail: str


class _Inconclusive(Exception):
    """The static walk cannot tell whether the module is there."""


def search_path(cwd: str, environ: Mapping[str, str]) -> list[str]:
    """Where a worker's ``python -m`` looks (the launcher's path after the workers' own entries)."""
    extra = [cwd, *(os.path.join(cwd, p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    out: list[str] = []
    for entry in [*extra, *sys.path]:
        if entry not in out:
            out.append(entry)
    return out


def find_missing(name: str, cwd: str, environ: Mapping[str, str]) -> Missing | None:
    """The first package or module of ``name`` that the workers cannot find, or None when they
    find it or the walk cannot tell (a broken finder, a package that may extend its path)."""
    parts = name.split(".")
    saved = sys.path[:]
    path = search_path(cwd, environ)
    sys.path[:] = path
    try:
        try:
            spec, finder = _find(parts[0], None) if parts[0] else (None, None)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            if parts[0] in sys.modules:  # the launcher's own (its __spec__ may be None: __main__)
                return None
            return Missing(parts[0], _looked_in_paths(cwd, path))
        if "" in parts:  # "pkg." or "pkg..x": Python's own message is clearer than a guess
            return None
        _same_as_imported(parts[0], spec)
        return _walk(parts, spec, finder)
    except Exception:  # noqa: BLE001 - _Inconclusive, or a finder's failure: not a missing module
        return None
    finally:
        sys.path[:] = saved


def _looked_in_paths(cwd: str, path: Sequence[str]) -> str:
    return (f"looked in the working directory {cwd}, PYTHONPATH and the paths of {sys.executable}: "
            f"{os.pathsep.join(path)}")


def _find(fullname: str, path: list[str] | None) -> tuple[ModuleSpec | None, object]:
    """The spec and finder the import system would use for ``fullname``, without ``sys.modules``."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:  # a legacy finder (find_module only): not asked here
            raise _Inconclusive(fullname)
        spec = find_spec(fullname, path)
        if spec is not None:
            return spec, finder
    return None, None


def _same_as_imported(name: str, spec: ModuleSpec) -> None:
    """A top-level module the launcher holds already (imported at start-up, as the workers will
    have it) must be the file found now, else the workers may use another one."""
    module = sys.modules.get(name)
    if module is None:
        return
    own = getattr(module, "__spec__", None)
    if own is None or own.origin != spec.origin:
        raise _Inconclusive(name)


def _walk(parts: list[str], spec: ModuleSpec, finder: object) -> Missing | None:
    """Find ``parts[1:]`` level by level below ``spec``, the spec of ``parts[0]``."""
    for i in range(1, len(parts)):
        parent, fullname = ".".join(parts[:i]), ".".join(parts[:i + 1])
        _require_static(spec, finder)
        locations = spec.submodule_search_locations
        if locations is None:
            return Missing(fullname, f"{parent!r} is not a package: {spec.origin}")
        locations = list(locations)
        spec, finder = _find(fullname, locations)
        if spec is None:
            return Missing(fullname, f"looked in the package {parent!r}: {os.pathsep.join(locations)}")
    return None


def _require_static(spec: ModuleSpec, finder: object) -> None:
    """Raise :class:`_Inconclusive` unless the module ``spec`` describes cannot, when imported,
    change where its submodules are found."""
    if finder is not importlib.machinery.PathFinder:
        raise _Inconclusive(spec.name)
    loader = spec.loader
    if loader is None or (_NAMESPACE_LOADER is not None and type(loader) is _NAMESPACE_LOADER):
        return  # a namespace package: no code, its portions are PathFinder's
    if type(loader) is not importlib.machinery.SourceFileLoader or not spec.origin:
        raise _Inconclusive(spec.name)
    try:
        with open(spec.origin, "rb") as f:
            source = f.read()
    except OSError:
        raise _Inconclusive(spec.name) from None
    if _DYNAMIC.search(source):
        raise _Inconclusive(spec.name)
