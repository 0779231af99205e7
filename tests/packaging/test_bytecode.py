"""After ``scripts/setup.sh`` every module of the tree has current bytecode, so a process that
imports the library compiles none of it, even where ``PYTHONDONTWRITEBYTECODE`` keeps Python
from caching bytecode itself (this project's VMs set it; an editable install gets none from pip).

These tests check the tree as set-up left it: after editing a file, run ``bash scripts/setup.sh``
(the README's test command does) before them."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.helpers.paths import REPO, child_pythonpath

_BYTE_COMPILE = REPO / "scripts" / "byte_compile.sh"


def _compiled_dirs() -> list[str]:
    """The directories set-up byte-compiles (the ``compileall`` line of scripts/byte_compile.sh)."""
    m = re.search(r"python3 -m compileall -q ([\w ]+)\n", _BYTE_COMPILE.read_text())
    assert m, "scripts/byte_compile.sh has no 'python3 -m compileall -q <dirs>' line"
    return m.group(1).split()


def _stale_or_missing(source: Path) -> str | None:
    """Why ``source`` has no bytecode that an import would use (PEP 552's timestamp header), or None."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    if not cached.exists():
        return "no bytecode"
    header = cached.read_bytes()[:16]
    st = source.stat()
    if header[:4] != importlib.util.MAGIC_NUMBER:
        return "bytecode of another Python"
    if int.from_bytes(header[4:8], "little") != 0:
        return "hash-based bytecode"
    if (int.from_bytes(header[8:12], "little"), int.from_bytes(header[12:16], "little")) != (
            int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF):
        return "bytecode older than the source"
    return None


def test_setup_byte_compiles_every_package_the_project_ships() -> None:
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = {pattern.rstrip("*") for pattern in include}
    assert shipped <= set(_compiled_dirs()), f"scripts/byte_compile.sh does not byte-compile {sorted(shipped - set(_compiled_dirs()))}"


def test_every_module_of_the_tree_has_current_bytecode() -> None:
    bad = {}
    for top in _compiled_dirs():
        for source in sorted((REPO / top).rglob("*.py")):
            why = _stale_or_missing(source)
            if why is not None:
                bad[str(source.relative_to(REPO))] = why
    assert not bad, (f"{len(bad)} modules would be compiled at every import (run bash scripts/setup.sh): "
                     f"{dict(list(bad.items())[:10])}")


_RANK = """
import json, sys
compiled = []
sys.addaudithook(lambda event, args: compiled.append(args[1]) if event == "compile" and isinstance(args[1], str)
                 and args[1].startswith(sys.argv[1]) else None)
import torch, torchcomms
comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="bytecode")
comm.all_reduce(torch.ones(2), torchcomms.ReduceOp.SUM, async_op=False)
comm.finalize()
print(json.dumps(compiled))
"""


def test_a_rank_compiles_none_of_the_librarys_source_where_python_writes_no_bytecode() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHCOMM_", "MASTER_"))}
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=child_pythonpath(), TORCHCOMM_RANK="0", TORCHCOMM_SIZE="1",
               TORCHCOMM_TRACING_DISABLE="1")
    out = subprocess.run([sys.executable, "-c", _RANK, str(REPO)], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    compiled = json.loads(out.stdout.strip().splitlines()[-1])
    assert compiled == [], f"compiled from source at import: {compiled}"
