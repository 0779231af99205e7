"""Environment validation and hostile names in the HTML view."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchcomms.tracing import attach as tattach
from torchcomms.tracing.viewer.analyze import analyze
from torchcomms.tracing.flight_recorder import _env_int
from torchcomms.tracing.viewer.html_view import render_html
from torchcomms.tracing.viewer.load import load_dumps

from tests.tracing._support import Rec, write_job


def test_bad_environment_values_raise_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHCOMM_FR_MAX_ENTRIES", "lots")
    with pytest.raises(ValueError, match="TORCHCOMM_FR_MAX_ENTRIES must be an integer, got 'lots'"):
        _env_int("TORCHCOMM_FR_MAX_ENTRIES", 2048)
    monkeypatch.setenv("TORCHCOMM_FR_MAX_ENTRIES", "-3")
    with pytest.raises(ValueError, match="TORCHCOMM_FR_MAX_ENTRIES must be >= 0"):
        _env_int("TORCHCOMM_FR_MAX_ENTRIES", 2048)
    monkeypatch.setenv("TORCHCOMM_FR_MAX_ENTRIES", "")
    assert _env_int("TORCHCOMM_FR_MAX_ENTRIES", 2048) == 2048
    monkeypatch.setenv("TORCHCOMM_FR_DUMP_ON_EXIT", "maybe")
    with pytest.raises(ValueError, match="TORCHCOMM_FR_DUMP_ON_EXIT must be 0/1/true/false"):
        tattach._truthy("TORCHCOMM_FR_DUMP_ON_EXIT", False)
    monkeypatch.setenv("TORCHCOMM_FR_DUMP_ON_EXIT", "yes")
    assert tattach._truthy("TORCHCOMM_FR_DUMP_ON_EXIT", False) is True


def test_hostile_names_cannot_break_out_of_the_page(tmp_path: Path) -> None:
    evil = '</script><img src=x onerror=alert(1)>&"'
    write_job(tmp_path, {r: [Rec(evil, (0, 1), r, "all_reduce", 1).complete()] for r in (0, 1)})
    ts = load_dumps([tmp_path])
    page = render_html(ts, analyze(ts), title=evil)
    assert "<img" not in page and page.count("</script>") == 2  # the data script and the code script
    data = page.split('<script id="trace-data" type="application/json">')[1].split("</script>")[0]
    assert json.loads(data)["ops"][0]["comm"] == evil


def test_hostile_names_cannot_drive_the_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from torchcomms.tracing.viewer.cli import run

    evil = "\x1b]0;owned\x07\x1b[2J\u202e[/]"  # retitle, clear the screen, reverse the line, close markup
    write_job(tmp_path / "a", {r: [Rec(evil, (0, 1), r, "all_reduce", 1, sizes=[[r + 1]]).complete()]
                               for r in (0, 1)}, run_id="job[/]\x1b[8m")
    assert run(["analyze", str(tmp_path / "a"), "--workers", "1"]) == 1  # the size mismatch
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "run job[/]\\x1b[8m" in out and "comm '\\x1b]0;owned\\x07\\x1b[2J\\u202e[/]'" in out
    write_job(tmp_path / "b", {2: [Rec("dp", (0, 2), 2, "all_reduce", 1).complete()]}, run_id="other\x1b[2J")
    assert run(["analyze", str(tmp_path / "a"), str(tmp_path / "b"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "rank 2: other\\x1b[2J" in err


def test_a_run_id_that_names_a_template_slot_stays_text(tmp_path: Path) -> None:
    write_job(tmp_path, {r: [Rec("dp", (0, 1), r, "all_reduce", 1).complete()] for r in (0, 1)}, run_id="__DATA__")
    ts = load_dumps([tmp_path])
    page = render_html(ts, analyze(ts))
    assert "<title>torchcomms trace — 2 ranks, run __DATA__</title>" in page
    assert "<h1>torchcomms trace — 2 ranks, run __DATA__</h1>" in page  # not the page's data


@pytest.mark.parametrize("flag", ["--workers", "--dump-cpu-s"])
def test_a_worker_count_or_dump_cpu_budget_below_one_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    from torchcomms.tracing.viewer.cli import run

    write_job(tmp_path, {r: [Rec("dp", (0, 1), r, "all_reduce", 1).complete()] for r in (0, 1)})
    assert run(["analyze", str(tmp_path), flag, "0"]) == 2
    assert capsys.readouterr().err == f"torchcomms-trace: error: {flag} must be >= 1, got 0\n"
    assert run(["analyze", str(tmp_path), flag, "1"]) == 0
