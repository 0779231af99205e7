"""The analysis gives, for every varied dump set, exactly the report (findings, messages,
statistics, exit code) recorded in ``data/analyze_reference.json`` from the Op-by-Op
analysis; through the CLI's ``--json`` as well."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tests.tracing import _varied_jobs
from torchcomms.tracing.viewer.cli import run


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _varied_jobs.build(tmp_path_factory.mktemp("varied"))


@pytest.fixture(scope="module")
def reference() -> dict[str, dict[str, object]]:
    return json.loads(_varied_jobs.REFERENCE.read_text())


@pytest.mark.parametrize("name", ["gen80", "gen16", "mixed", "pytorch_json", "scheduled"])
def test_report_matches_reference(name: str, sets: dict[str, Path], reference: dict[str, dict[str, object]]) -> None:
    top = 3 if name == "gen80" else 10
    assert _varied_jobs.report_of(sets[name], top=top) == reference[name]


def test_cli_json_and_exit_code_match_reference(sets: dict[str, Path], reference: dict[str, dict[str, object]],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("mixed", "scheduled"):
        code = run(["analyze", "--json", "--no-progress", str(sets[name])])
        out = json.loads(capsys.readouterr().out.replace(str(REPO), "<repo>"))
        assert code == reference[name]["exit_code"] and out == reference[name]


@pytest.mark.parametrize("name", ["gen16", "mixed"])
def test_report_is_the_same_when_grids_are_checked_in_blocks(name: str, sets: dict[str, Path],
                                                             reference: dict[str, dict[str, object]],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from torchcomms.tracing.viewer import analyze as analyze_module

    for cells in (1, 40):  # a column at a time; a few columns at a time
        monkeypatch.setattr(analyze_module, "GRID_CELLS", cells)
        assert _varied_jobs.report_of(sets[name]) == reference[name]
