"""The columnar form of dumps: ops read back from the columns equal the entry-by-entry parse,
the parse in worker processes gives what the parse in the caller gives (errors included), and
the HTML view's grouped bars computed on arrays equal the op-by-op ones."""
from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO, child_pythonpath
from tests.tracing import _varied_jobs
from torchcomms.tracing.viewer import aggregate, html_view
from torchcomms.tracing.viewer.analyze import analyze
from torchcomms.tracing.viewer.columns import OpColumns, columns_of_ops
from torchcomms.tracing.viewer.load import TraceInputError, _parse_entry, _read_raw, load_dumps, parse_dump
from torchcomms.tracing.viewer.shared import SharedValues


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _varied_jobs.build(tmp_path_factory.mktemp("varied"))


def _hint(path: Path) -> int:
    return int(path.name.rsplit("_", 1)[1])


def _entry_by_entry(path: Path) -> list[object]:
    """The ops as the entry-by-entry parse makes them."""
    obj = _read_raw(path)
    d = parse_dump(obj, str(path), _hint(path))
    ext = obj.get("torchcomms") if isinstance(obj.get("torchcomms"), dict) else {}
    shared = SharedValues()
    return [_parse_entry(e, d.rank, ext.get("ops", {}), d.comms, shared) for e in obj["entries"]]


@pytest.mark.parametrize("name", ["mixed", "pytorch_json", "gen16"])
def test_columns_read_back_as_the_entry_by_entry_ops(name: str, sets: dict[str, Path]) -> None:
    for path in sorted(sets[name].iterdir()):
        d = parse_dump(_read_raw(path), str(path), _hint(path))
        assert isinstance(d.ops, OpColumns)
        expected = _entry_by_entry(path)
        assert list(d.ops) == expected
        assert len(d.ops) == len(expected) and d.ops[-1] == expected[-1] and d.ops[1:3] == expected[1:3]
        again = pickle.loads(pickle.dumps(d.ops))
        assert list(again) == expected
        assert list(columns_of_ops(d.rank, expected)) == expected  # columns of Op objects too


def test_entries_with_unusual_values_read_back_alike(tmp_path: Path) -> None:
    base = {"record_id": 0, "pg_id": "g", "process_group": ["g", "g"], "profiling_name": "gloo:all_reduce",
            "collective_seq_id": 1, "p2p_seq_id": 0, "time_created_ns": 5, "duration_ms": 1.5,
            "input_sizes": [[4]], "input_dtypes": ["float32"], "output_sizes": [[4]], "output_dtypes": ["float32"],
            "state": "completed", "is_p2p": False, "frames": []}
    variants = [
        {}, {"time_created_ns": None}, {"time_created_ns": 0}, {"time_created_ns": "7"}, {"duration_ms": None},
        {"duration_ms": 2}, {"duration_ms": True}, {"input_sizes": [[4.0]]}, {"input_sizes": [[True]]},
        {"record_id": "3"}, {"collective_seq_id": 1 << 70}, {"state": 3}, {"profiling_name": "gloo:send 0->1", "is_p2p": True, "p2p_seq_id": 2},
        {"frames": [{"name": "f", "filename": "a.py", "line": 1}]}, {"frames": [{"name": "f", "filename": "a.py", "line": 1.0}]},
        {"pg_id": None, "process_group": None}, {"input_sizes": [[4]], "output_sizes": {"x": 1}},
    ]
    entries = [dict(base, record_id=i, **{k: v for k, v in var.items() if k != "record_id"}) for i, var in enumerate(variants)]
    entries[9]["record_id"] = "9"
    path = tmp_path / "fr_rank_0"
    path.write_bytes(pickle.dumps({"version": "2.10", "pg_config": {"g": {"desc": "g", "ranks": "[0, 1]"}}, "entries": entries}))
    assert list(load_dumps([path], workers=1).dumps[0].ops) == _entry_by_entry(path)


@pytest.mark.parametrize("bad_entry, needle", [
    (5, "entry 1 is int, not a dict"),
    ({"record_id": 1}, "entry 1 is malformed (KeyError: 'profiling_name')"),
    ({"record_id": "x", "profiling_name": "gloo:all_reduce"}, "entry 1 is malformed (ValueError"),
])
def test_a_malformed_entry_names_the_file_and_entry(tmp_path: Path, bad_entry: object, needle: str) -> None:
    good = {"record_id": 0, "profiling_name": "gloo:all_reduce", "collective_seq_id": 1}
    path = tmp_path / "fr_rank_0"
    path.write_bytes(pickle.dumps({"version": "2.10", "entries": [good, bad_entry]}))
    with pytest.raises(TraceInputError, match=re.escape("fr_rank_0: " + needle)):
        load_dumps([path], workers=1)


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_workers_give_the_same_dumps_and_report(sets: dict[str, Path]) -> None:
    for name in ("gen80", "gen16"):
        serial, parallel = load_dumps([sets[name]], workers=1), load_dumps([sets[name]], workers=2)
        assert serial.ranks == parallel.ranks
        for r in serial.ranks:
            assert list(serial.dumps[r].ops) == list(parallel.dumps[r].ops)
        assert analyze(serial).as_dict() == analyze(parallel).as_dict()


def test_a_bad_dump_parsed_in_a_worker_is_a_typed_error_naming_it(sets: dict[str, Path], tmp_path: Path) -> None:
    job = _copy(sets["gen80"], tmp_path / "job")
    (job / "fr_rank_41").write_bytes((job / "fr_rank_41").read_bytes()[:5000])
    (job / "fr_rank_7").write_bytes(pickle.dumps({"version": "2.10", "entries": [{"record_id": 0}]}))
    with pytest.raises(TraceInputError) as here:
        load_dumps([job], workers=1)
    with pytest.raises(TraceInputError) as err:
        load_dumps([job], workers=2)
    # files go in name order (fr_rank_0, fr_rank_1, fr_rank_10, ...): fr_rank_41 comes first
    assert str(err.value) == str(here.value) == f"{job / 'fr_rank_41'}: corrupt pickle dump (pickle data was truncated)"
    (job / "fr_rank_41").unlink()
    with pytest.raises(TraceInputError, match=r"fr_rank_7: entry 0 is malformed \(KeyError: 'profiling_name'\)"):
        load_dumps([job], workers=2)
    (job / "fr_rank_7").unlink()
    (job / "x_3").write_bytes((job / "fr_rank_3").read_bytes())
    with pytest.raises(TraceInputError, match=r"x_3: a second dump for rank 3"):
        load_dumps([job], workers=2)


def test_grouped_view_bars_from_arrays_equal_the_op_by_op_bars(sets: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    ts = load_dumps([sets["gen80"]], workers=1)
    report = analyze(ts)
    monkeypatch.setattr(aggregate.merge_runs, "__defaults__", (25,))  # runs merge in both paths
    by_arrays = html_view.view_data(ts, report)
    assert any(bar.get("merged") for bar in by_arrays["ops"])
    monkeypatch.setattr(html_view, "group_bars", lambda *a, **k: None)
    assert json.dumps(by_arrays) == json.dumps(html_view.view_data(ts, report))


def _trace_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchcomms.tracing.viewer", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=child_pythonpath()))


def test_cli_with_workers_and_progress_prints_the_same_report(sets: dict[str, Path]) -> None:
    plain = _trace_cli("analyze", "--json", "--no-progress", "--workers", "1", str(sets["gen80"]))
    shown = _trace_cli("analyze", "--json", "--progress", "--workers", "2", str(sets["gen80"]))
    assert plain.returncode == shown.returncode == 1
    assert plain.stdout == shown.stdout and "Traceback" not in shown.stderr
    bad = _trace_cli("analyze", "--workers", "0", str(sets["gen80"]))
    assert bad.returncode == 2 and "--workers must be >= 1" in bad.stderr


def test_numbers_past_int64_are_analysed_exactly(tmp_path: Path) -> None:
    for r in range(3):
        entries = [{"record_id": i, "profiling_name": "gloo:all_reduce", "collective_seq_id": s, "state": "completed",
                    "time_created_ns": (1 << 66) + i * 1000 + r, "duration_ms": 0.5, "input_sizes": [[4]],
                    "input_dtypes": ["float32"], "output_sizes": [[4]], "process_group": ["g", "g"]}
                   for i, s in enumerate([1, 2, 1 << 70])]
        (tmp_path / f"fr_rank_{r}").write_bytes(pickle.dumps(
            {"version": "2.10", "pg_config": {"g": {"desc": "g", "ranks": [0, 1, 2]}}, "entries": entries}))
    ts = load_dumps([tmp_path], workers=1)
    report = analyze(ts)
    assert report.findings == [] and report.collective_count == 3
    assert [s["seq"] for s in report.slowest] == [1, 2, 1 << 70]
    assert {s["rank"]: s["mean_lag_ms"] for s in report.stragglers} == {2: 2e-6, 1: 1e-6, 0: 0.0}
    assert html_view.view_data(ts, report)["ops"][-1]["seq"] == 1 << 70
