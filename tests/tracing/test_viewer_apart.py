"""The offline viewer stays off the library's import path; the NaN guard lives in guards/."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO, child_pythonpath

# A traced job: flight recorder, log events, spans and the NaN guard on; one op, a dump, finalize.
_TRACED_JOB = r"""
import json, sys, torch, torchcomms
from torchcomms.hooks import FlightRecorderHook, NanCheckHook
from torchcomms.tracing.flight_recorder import process_recorder
c = torchcomms.new_comm("fake", "cpu", "apart", hints={"rank": "0", "size": "2"})
NanCheckHook().register_with_comm(c)
c.all_reduce(torch.ones(4), torchcomms.ReduceOp.SUM, async_op=False)
process_recorder().dump_file(reason="test")
c.finalize()
print(json.dumps(sorted(m for m in sys.modules if m.startswith("torchcomms"))))
"""


def test_a_traced_comm_never_imports_the_viewer(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), TORCHCOMM_FR_DUMP_TEMP_FILE=str(tmp_path / "fr_"),
               TORCHCOMM_OTEL=f"file:{tmp_path / 'spans.jsonl'}", TORCHCOMM_LOG_EVENTS="1",
               TORCHCOMM_FR_DUMP_ON_EXIT="1", TORCHCOMM_RUN_ID="apart")
    env.pop("TORCHCOMM_TRACING_DISABLE", None)
    res = subprocess.run([sys.executable, "-c", _TRACED_JOB], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    loaded = set(json.loads(res.stdout.strip().splitlines()[-1]))
    # tracing was really on: every recorder ran in this process ...
    assert {"torchcomms.tracing.flight_recorder", "torchcomms.tracing.logging", "torchcomms.tracing.spans",
            "torchcomms.guards.nan_check"} <= loaded
    assert (tmp_path / "fr_0").is_file()
    # ... and not one viewer module came with them
    assert sorted(m for m in loaded if m.startswith("torchcomms.tracing.viewer")) == []


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_no_library_module_imports_the_viewer() -> None:
    viewer = REPO / "torchcomms" / "tracing" / "viewer"
    offenders = [
        str(p.relative_to(REPO))
        for p in sorted((REPO / "torchcomms").rglob("*.py"))
        if viewer not in p.parents and any(m.startswith("torchcomms.tracing.viewer") for m in _imported_modules(p))
    ]
    assert offenders == []


def test_viewer_runs_as_a_module_and_guard_keeps_its_public_names() -> None:
    import torchcomms.hooks
    from torchcomms.guards import NanCheckHook

    assert torchcomms.hooks.NanCheckHook is NanCheckHook
    assert "NanCheckHook" in torchcomms.hooks.__all__
    res = subprocess.run([sys.executable, "-m", "torchcomms.tracing.viewer", "--help"], cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=child_pythonpath()), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "torchcomms-trace" in res.stdout and "analyze" in res.stdout


def test_the_viewer_needs_neither_torch_nor_a_recorder() -> None:
    script = ("import sys, torchcomms.tracing.viewer.cli, torchcomms.tracing.viewer.analyze, "
              "torchcomms.tracing.viewer.html_view, torchcomms.tracing.viewer.perfetto; "
              "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'torchcomms.tracing.spans'))))")
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=dict(os.environ, PYTHONPATH=child_pythonpath()),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]"
