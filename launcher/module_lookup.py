"""Whether the workers' ``python -m NAME`` can find ``NAME``, asked without running any of it.

Only the top-level name is looked up (``pkg`` of ``pkg.sub``): finding ``pkg.sub`` would import
``pkg`` (its ``__init__`` may run anything, import torch, or extend its own ``__path__``, so no
static walk can say that a submodule is missing). The lookup is :func:`importlib.util.find_spec`
of the launcher's own interpreter, which is the workers', so the finders installed at start-up
count (an editable install's, zip imports, built-in and frozen modules), with the workers' search
path in front of the launcher's: their working directory (``python -m`` puts it first) and the
entries of their ``PYTHONPATH``. A name is so never refused that a worker could import.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping

__all__ = ["top_level_found", "search_path"]


def search_path(cwd: str, environ: Mapping[str, str]) -> list[str]:
    """Where a worker's ``python -m`` looks (the launcher's path after the workers' own entries)."""
    extra = [cwd, *(os.path.join(cwd, p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    out: list[str] = []
    for entry in [*extra, *sys.path]:
        if entry not in out:
            out.append(entry)
    return out


def top_level_found(name: str, cwd: str, environ: Mapping[str, str]) -> bool:
    """Whether the top-level package or module of ``name`` is found on the workers' search path;
    True also when the lookup itself fails (a broken finder: the workers will say what is wrong)."""
    top = name.split(".", 1)[0]
    if not top:
        return False
    if top in sys.modules:  # the launcher's own (its __spec__ may be None: __main__)
        return True
    saved = sys.path[:]
    sys.path[:] = search_path(cwd, environ)
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False
    except Exception:  # noqa: BLE001 - a third-party finder's failure is not a missing module
        return True
    finally:
        sys.path[:] = saved
