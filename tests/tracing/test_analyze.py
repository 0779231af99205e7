"""The analyzer and the CLI on synthetic dumps: culprits, mismatches, stats, unusable input."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from torchcomms.tracing.viewer.analyze import analyze
from torchcomms.tracing.viewer.cli import run
from torchcomms.tracing.viewer.load import TraceInputError, load_dumps

from tests.tracing._support import REPO, Rec, write_job

T0 = 1_790_000_000_000_000_000  # a fixed epoch (ns) so times are reproducible
RANKS = (0, 1, 2, 3)


def _ok(rank: int, seq: int, name: str = "all_reduce", lag_ns: int = 0, **kw: object) -> Rec:
    return Rec("dp", RANKS, rank, name, seq, t0=T0 + seq * 10_000_000 + lag_ns, **kw).complete(2_000_000)  # type: ignore[arg-type]


def _hang_job(tmp_path: Path) -> Path:
    """Ranks 0-2 enter all_reduce #3 and wait; rank 3 never does."""
    per_rank = {}
    for r in RANKS:
        recs = [_ok(r, 1, lag_ns=r * 1000), _ok(r, 2, "barrier", sizes=[])]
        if r != 3:
            recs.append(Rec("dp", RANKS, r, "all_reduce", 3, t0=T0 + 30_000_000 + r).start())
        per_rank[r] = recs
    write_job(tmp_path, per_rank)
    return tmp_path


def test_missing_rank_is_named_with_op_seq_and_waiters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = analyze(load_dumps([_hang_job(tmp_path)]))
    missing = [f for f in report.findings if f.kind == "missing_rank"]
    assert len(missing) == 1
    f = missing[0]
    assert (f.ranks, f.op, f.seq, f.comm) == ([3], "all_reduce", 3, "dp")
    assert "rank 3 never entered all_reduce #3 on comm 'dp'; ranks 0-2 waiting since" in f.message
    assert sorted(f.calls) == [0, 1, 2]
    assert report.exit_code == 1 and report.culprit_ranks == {3}
    assert run(["analyze", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "rank 3 never entered all_reduce #3" in out


def test_clean_job_exits_zero_and_reports_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    per_rank = {r: [_ok(r, s, lag_ns=(5_000_000 if r == 2 else r * 1000)) for s in range(1, 6)] for r in RANKS}
    write_job(tmp_path, per_rank)
    report = analyze(load_dumps([tmp_path]))
    assert report.findings == [] and report.exit_code == 0
    assert report.collective_count == 5
    top = report.stragglers[0]
    assert top["rank"] == 2 and top["times_last"] == 5 and top["mean_lag_ms"] == pytest.approx(5.0, abs=0.01)
    assert report.slowest[0]["duration_ms"] == pytest.approx(2.0)
    bw = report.bandwidth[0]
    assert bw["bytes"] == 4096 and bw["count"] == 5
    assert bw["algbw_gbps"] == pytest.approx(4096 / 2e-3 / 1e9)
    assert bw["busbw_gbps"] == pytest.approx(bw["algbw_gbps"] * 2 * 3 / 4)
    assert run(["analyze", "--json", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["exit_code"] == 0 and data["stragglers"][0]["rank"] == 2


def test_size_mismatch_shows_every_ranks_call(tmp_path: Path) -> None:
    per_rank = {r: [_ok(r, 1, sizes=[[64]] if r == 0 else [[32]])] for r in (0, 1)}
    for r in per_rank:
        for rec in per_rank[r]:
            rec.comm_ranks, rec.size = (0, 1), 2
    write_job(tmp_path, per_rank)
    report = analyze(load_dumps([tmp_path]))
    (f,) = [f for f in report.findings if f.kind == "mismatch"]
    assert "input sizes differ: rank 0 [[64]], rank 1 [[32]]" in f.message
    assert "in=[[64]]" in f.calls[0] and "in=[[32]]" in f.calls[1]


def test_op_and_dtype_mismatches(tmp_path: Path) -> None:
    per_rank = {
        0: [_ok(0, 1, "all_reduce"), _ok(0, 2, dtype="float32")],
        1: [_ok(1, 1, "broadcast", root=0), _ok(1, 2, dtype="bfloat16")],
    }
    for recs in per_rank.values():
        for rec in recs:
            rec.comm_ranks, rec.size = (0, 1), 2
    write_job(tmp_path, per_rank)
    msgs = [f.message for f in analyze(load_dumps([tmp_path])).findings]
    assert any("different ops: rank 0 all_reduce, rank 1 broadcast" in m for m in msgs)
    assert any("dtypes differ: rank 0 float32, rank 1 bfloat16" in m for m in msgs)


def test_p2p_send_without_recv(tmp_path: Path) -> None:
    ranks = (0, 1)
    per_rank = {
        0: [Rec("pp", ranks, 0, "send", 1, is_p2p=True, peer=1, t0=T0).start()],
        1: [Rec("pp", ranks, 1, "barrier", 1, sizes=[], t0=T0).complete()],
    }
    per_rank[0].insert(0, Rec("pp", ranks, 0, "barrier", 1, sizes=[], t0=T0).complete())
    write_job(tmp_path, per_rank)
    (f,) = [f for f in analyze(load_dumps([tmp_path])).findings if f.kind == "p2p_unmatched"]
    assert f.ranks == [1] and "rank 1 never posted the recv from rank 0" in f.message


def test_missing_dump_of_a_member_is_a_problem(tmp_path: Path) -> None:
    write_job(tmp_path, {r: [_ok(r, 1)] for r in (0, 1, 2)})  # rank 3 of 4 left no dump
    report = analyze(load_dumps([tmp_path]))
    (f,) = [f for f in report.findings if f.kind == "missing_dump"]
    assert f.ranks == [3] and report.exit_code == 1


def test_evicted_history_is_not_reported_missing(tmp_path: Path) -> None:
    per_rank = {r: [_ok(r, s) for s in range(1 if r == 0 else 4, 8)] for r in (0, 1)}
    for recs in per_rank.values():
        for rec in recs:
            rec.comm_ranks, rec.size = (0, 1), 2
    write_job(tmp_path, per_rank)
    assert analyze(load_dumps([tmp_path])).findings == []


# -- unusable input: exit 2, one line, no traceback ----------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchcomms.tracing.viewer.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def _assert_unusable(res: subprocess.CompletedProcess[str], needle: str) -> None:
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], res.stderr


def test_unusable_inputs_give_one_line_and_exit_2(tmp_path: Path) -> None:
    good = write_job(tmp_path / "good", {0: [_ok(0, 1)]})[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    _assert_unusable(_cli("analyze", str(empty)), "folder holds no dump files")
    _assert_unusable(_cli("analyze", str(tmp_path / "nope")), "no such file or folder")
    trunc = tmp_path / "trunc_0"
    trunc.write_bytes(good.read_bytes()[:100])
    _assert_unusable(_cli("analyze", str(trunc)), "truncated")
    wrong = tmp_path / "wrong_0"
    d = pickle.loads(good.read_bytes())
    d["version"] = "9.1"
    wrong.write_bytes(pickle.dumps(d))
    _assert_unusable(_cli("analyze", str(wrong)), "unknown flight-recorder format version '9.1'")
    text = tmp_path / "notes_0"
    text.write_text("hello")
    _assert_unusable(_cli("view", str(text), "-o", str(tmp_path / "x.html")), "not a flight-recorder dump")
    evil = tmp_path / "evil_0"
    evil.write_bytes(pickle.dumps({"version": "2.10", "entries": [], "x": Path("/")}))
    _assert_unusable(_cli("analyze", str(evil)), "refusing to load")
    other = write_job(tmp_path / "other", {1: [_ok(1, 1)]}, run_id="job-2")[0]
    _assert_unusable(_cli("analyze", str(good), str(other)), "different jobs")
    twice = tmp_path / "twice"
    twice.mkdir()
    (twice / "a_0").write_bytes(good.read_bytes())
    (twice / "b_0").write_bytes(good.read_bytes())
    _assert_unusable(_cli("export", str(twice), "--perfetto", str(tmp_path / "p.json")), "a second dump for rank 0")
    _assert_unusable(_cli("analyze", "--top", "-1", str(good)), "--top")
    _assert_unusable(_cli("view", str(good), "-o", str(tmp_path / "no" / "such" / "x.html")), "cannot write output: no such folder")
    _assert_unusable(_cli("frobnicate"), "invalid choice")


def test_load_errors_are_typed(tmp_path: Path) -> None:
    with pytest.raises(TraceInputError, match="no dumps given"):
        load_dumps([])
    bad = tmp_path / "x_0"
    bad.write_text('{"version": "2.10"}')
    with pytest.raises(TraceInputError, match="no entries"):
        load_dumps([bad])
