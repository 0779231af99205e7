"""``torchcomms-trace`` past 64 ranks: findings group ranks by call, the straggler table keeps
its slowest rows, and the HTML view shows lanes of rank groups (culprit ranks alone). The dumps
are written by ``benchmarks/trace_dumps_gen.py`` (the recorder's own writer) at a small size;
the size claim (1,024 ranks) is ``benchmarks/trace_scale_bench.py``'s."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO, child_pythonpath
from torchcomms.tracing.viewer.aggregate import group_ranks, merge_runs, rank_groups
from torchcomms.tracing.viewer.analyze import analyze
from torchcomms.tracing.viewer.cli import run
from torchcomms.tracing.viewer.html_view import render_html, view_data
from torchcomms.tracing.viewer.load import load_dumps

RANKS, LATE, ODD = 80, 65, 3


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fr80")
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "trace_dumps_gen.py"), str(out),
                    "--ranks", str(RANKS), "--entries", "64", "--mismatch-seq", "10", "--procs", "1"],
                   check=True, env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin"},
                   capture_output=True)
    return out


def test_cli_groups_ranks_by_call(dumps: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["analyze", str(dumps), "--top", "5", "--no-progress"]) == 1
    out = capsys.readouterr().out
    # the planted mismatch: one line per distinct size, not one per rank
    assert "input sizes differ: ranks 0-2,4-79 [[16384]], rank 3 [[16385]]" in out
    # the planted hang: the ranks that wait, as ranges
    assert f"rank {LATE} never entered" in out and "ranks 0-64,66-79 waiting since" in out
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("PROBLEM (mismatch)"))
    end = next(i for i, ln in enumerate(lines) if i > start and ln.startswith(("PROBLEM", "Arrival")))
    assert lines[start + 1].split() == ["ranks", "call"]
    call_rows = [ln.split()[0] for ln in lines[start + 2:end] if "(in=[[1638" in ln]
    assert call_rows == ["0-2,4-79", "3"]
    # the straggler table: the 5 slowest ranks (the late one first), then a summary line
    first = next(i for i, ln in enumerate(lines) if ln.startswith("Arrival"))
    last = next(i for i, ln in enumerate(lines) if ln.startswith("... and"))
    table = [ln for ln in lines[first:last] if ln.startswith("│")]
    assert table[0].split("│")[1].strip() == str(LATE) and len(table) == 5
    assert f"... and {RANKS - 5} more ranks" in out


def test_json_report_keeps_every_rank(dumps: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["analyze", str(dumps), "--json", "--no-progress"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert len(report["stragglers"]) == RANKS
    mismatch = next(f for f in report["findings"] if f["kind"] == "mismatch")
    assert sorted(int(r) for r in mismatch["calls"]) == list(range(RANKS))


def test_view_has_lanes_of_rank_groups(dumps: Path) -> None:
    ts = load_dumps([dumps])
    report = analyze(ts)
    assert report.culprit_ranks == {LATE}
    data = view_data(ts, report)
    lanes = data["lanes"]
    # 79 ranks in blocks of 3 (at most 32 lanes) plus the culprit's own lane
    assert len(lanes) == 27 + 1
    assert lanes[0] == {"rank": None, "ranks": "0-2", "culprit": False, "label": "ranks 0-2"}
    culprit = [ln for ln in lanes if ln["culprit"]]
    assert culprit == [{"rank": LATE, "ranks": str(LATE), "culprit": True, "label": f"rank {LATE} · node0008"}]
    covered = sorted(r for ln in lanes for r in _ranks(ln["ranks"]))
    assert covered == list(range(RANKS))
    # one bar per (lane, comm, op, seq): world all_reduce #1 of ranks 0-2 spans their first
    # start to their last finish
    ops = {r: next(o for o in ts.dumps[r].ops if o.comm == "0" and o.seq == 1 and not o.is_p2p) for r in (0, 1, 2)}
    origin = min(o.created_ns for d in ts.dumps.values() for o in d.ops if o.created_ns)
    bar = next(b for b in data["ops"] if b["lane"] == 0 and b["comm"] == "0" and b["seq"] == 1 and b["op"] == ops[0].op)
    assert bar["start"] == pytest.approx((min(o.created_ns for o in ops.values()) - origin) / 1e6)
    assert bar["end"] == pytest.approx((max(o.completed_ns for o in ops.values()) - origin) / 1e6)
    assert bar["call"].startswith("3 ranks; last to finish: rank 2, ")
    assert len([b for b in data["ops"] if b["lane"] == 0 and b["comm"] == "0" and b["seq"] == 1
                and b["op"] == ops[0].op]) == 1
    page = render_html(ts, report)
    assert '"label":"ranks 0-2"' in page


def _ranks(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def test_merge_runs_bounds_bars_and_keeps_culprits() -> None:
    bars = [{"comm": "0", "op": "all_reduce" if i % 3 else "broadcast", "seq": i, "start": float(i),
             "end": i + 0.5, "state": "completed", "inflight": False, "error": None, "call": "",
             "culprit": i == 57, "lane": 0} for i in range(100)]
    merged = merge_runs(bars, limit=10)
    assert len(merged) <= 10 + 1
    assert [b["seq"] for b in merged if b["culprit"]] == [57]
    assert sum(b.get("merged", 1) for b in merged) == 100
    first = merged[0]
    assert first["merged"] == 10 and first["start"] == 0.0 and first["end"] == 9.5
    assert first["call"] == "10 ops, #0 to #9: 6 all_reduce, 4 broadcast"


def test_group_helpers() -> None:
    assert group_ranks({0: "a", 1: "b", 2: "a", 3: "a"}) == [([0, 2, 3], "a"), ([1], "b")]
    assert rank_groups(list(range(10)), {4}, lanes=3) == [[0, 1, 2], [3, 5, 6], [4], [7, 8, 9]]
