"""Dumps crafted to hurt the viewer: self-referring pickles, values no dump holds, nesting
(pickles that hang or crash the unpickler itself: test_hostile_pickles.py).

Each is refused with a :class:`TraceInputError` naming the file (the CLI: one line, exit 2), or
read with the bad value dropped; none hangs, exhausts memory or ends in an internal error.
"""
from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchcomms.tracing.viewer.analyze import analyze
from torchcomms.tracing.viewer.html_view import render_html
from torchcomms.tracing.viewer.load import TraceInputError, load_dumps
from torchcomms.tracing.viewer.perfetto import to_perfetto

from tests.tracing._support import REPO, Rec, write_job


def _good_dump(tmp_path: Path) -> dict[str, Any]:
    path = write_job(tmp_path / "good", {0: [Rec("c0", (0,), 0, "all_reduce", 1).complete()]})[0]
    return pickle.loads(path.read_bytes())


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchcomms.tracing.viewer", *args, "--workers", "1"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)


def _laughs(depth: int) -> list[Any]:
    """A list standing for 10**depth strings, pickled in a few hundred bytes (each level
    refers to the one below ten times)."""
    level: list[Any] = ["x" * 10]
    for _ in range(depth):
        level = [level] * 10
    return level


def test_a_pickle_that_refers_to_one_list_again_and_again_is_refused(tmp_path: Path) -> None:
    dump = _good_dump(tmp_path)
    dump["entries"][0]["input_dtypes"] = _laughs(7)  # ten million strings
    bomb = tmp_path / "bomb_0"
    bomb.write_bytes(pickle.dumps(dump, protocol=4))
    assert bomb.stat().st_size < 4096
    with pytest.raises(TraceInputError, match=r"bomb_0: not a flight-recorder dump \(it refers to its own values"):
        load_dumps([bomb], workers=1)
    res = _cli("analyze", str(bomb))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "refers to its own values" in res.stderr


def _with_deep_list(dump: dict[str, Any], depth: int) -> bytes:
    """``dump`` pickled with its "DEEP" string replaced by a list nested ``depth`` deep (MARK
    ``depth`` times, an empty list, LIST ``depth`` times: ``pickle.dumps`` itself would recurse)."""
    data = pickle.dumps(dump, protocol=4)
    placeholder = b"\x8c\x04DEEP\x94"  # SHORT_BINUNICODE, MEMOIZE
    assert data.count(placeholder) == 1
    return data.replace(placeholder, b"(" * depth + b"]" + b"l" * depth + b"\x94")


def test_a_pickle_that_holds_itself_or_nests_deeply_is_read_without_it_or_refused(tmp_path: Path) -> None:
    dump = _good_dump(tmp_path)
    loop: list[Any] = []
    loop.append(loop)
    for name, where, value in (("cyclic_0", "frames", [{"name": loop}]), ("nested_0", "frames", [{"name": "DEEP"}]),
                               ("cyclic_1", "process_group", [loop, "desc"])):
        odd = copy.deepcopy(dump)
        odd["entries"][0][where] = value
        path = tmp_path / name
        path.write_bytes(_with_deep_list(odd, 100_000) if name == "nested_0" else pickle.dumps(odd, protocol=4))
        op = load_dumps([path], workers=1).dumps[0].ops[0]  # (the rank inside the dump)
        assert op.frames == [{}] if where == "frames" else op.comm == "[[...]]"
    dump["entries"][0]["profiling_name"] = "DEEP"  # spelled out as the op's name: too deep for ``str``
    path = tmp_path / "nested_1"
    path.write_bytes(_with_deep_list(dump, 100_000))
    with pytest.raises(TraceInputError, match=r"nested_1: not a flight-recorder dump \(a value nests too deeply"):
        load_dumps([path], workers=1)
    res = _cli("analyze", str(path))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "nests too deeply" in res.stderr


def test_json_that_nests_past_the_parsers_recursion_limit_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep_0"
    deep.write_text('{"version": "2.10", "entries": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(TraceInputError, match="deep_0: not a flight-recorder dump .*nests too deeply"):
        load_dumps([deep], workers=1)
    res = _cli("analyze", str(deep))
    assert res.returncode == 2 and "internal error" not in res.stderr and "nests too deeply" in res.stderr


@pytest.mark.parametrize("field", ["record_id", "collective_seq_id", "time_created_ns",
                                   "time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms"])
def test_infinite_numbers_in_an_entry_are_errors_or_dropped(tmp_path: Path, field: str) -> None:
    dump = _good_dump(tmp_path)
    dump["entries"][0][field] = float("inf")
    path = tmp_path / "inf_0.json"
    path.write_text(json.dumps(dump))  # JSON as Python writes it: ``Infinity``
    try:
        ts = load_dumps([path], workers=1)
    except TraceInputError as exc:
        assert "inf_0.json: entry 0 is malformed (OverflowError" in str(exc)
        assert field in ("record_id", "collective_seq_id")
        return
    assert field not in ("record_id", "collective_seq_id")
    report = analyze(ts)
    render_html(ts, report, None)
    json.dumps(to_perfetto(ts, report))
    op = ts.dumps[0].ops[0]
    assert None in (op.created_ns, op.started_ns, op.completed_ns, op.timeout_ms)


@pytest.mark.parametrize("where,value", [(("rank",), float("inf")), (("pid",), float("-inf")),
                                         (("world_size",), float("inf")), (("dumped_at_ns",), float("inf")),
                                         (("ops", "0", "seq"), float("inf")), (("ops", "0", "peer"), float("inf")),
                                         (("comms",), "not a map"), (("comms",), None)])
def test_odd_values_in_the_extension_are_dropped(tmp_path: Path, where: tuple[str, ...], value: Any) -> None:
    dump = _good_dump(tmp_path)
    node = dump["torchcomms"]
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    path = tmp_path / "odd_0"
    path.write_bytes(pickle.dumps(dump))
    ts = load_dumps([path], workers=1)
    assert ts.ranks == [0]  # the rank from the file name when the one inside is unusable
    report = analyze(ts)
    render_html(ts, report, None)


def test_a_rank_past_any_job_and_ranks_that_are_not_ints_are_named(tmp_path: Path) -> None:
    dump = _good_dump(tmp_path)
    huge = copy.deepcopy(dump)
    huge["torchcomms"]["rank"] = 2**40
    path = tmp_path / "huge_0"
    path.write_bytes(pickle.dumps(huge))
    with pytest.raises(TraceInputError, match=r"huge_0: rank 1099511627776 is out of range"):
        load_dumps([path], workers=1)
    for ranks in ([None], [[1]], ["a", 1]):
        bad = copy.deepcopy(dump)
        bad["pg_config"]["c0"]["ranks"] = ranks
        path = tmp_path / "ranks_0"
        path.write_bytes(pickle.dumps(bad))
        with pytest.raises(TraceInputError, match="ranks_0: pg_config of communicator 'c0': 'ranks' is not a list of ints"):
            load_dumps([path], workers=1)


def test_durations_that_are_not_finite_are_dropped_and_the_json_report_stays_json(tmp_path: Path) -> None:
    paths = write_job(tmp_path / "job", {r: [Rec("c0", (0, 1), r, "all_reduce", s).complete() for s in (1, 2, 3)]
                                         for r in (0, 1)})
    dump = pickle.loads(paths[0].read_bytes())
    for entry, odd in zip(dump["entries"], (float("nan"), float("inf"), float("-inf"))):
        entry["duration_ms"] = odd
    paths[0].write_bytes(pickle.dumps(dump))
    ts = load_dumps([tmp_path / "job"], workers=1)
    assert [op.duration_ms for op in ts.dumps[0].ops] == [None, None, None]
    res = _cli("analyze", "--json", str(tmp_path / "job"))
    assert res.returncode == 0, res.stderr

    def no_constants(word: str) -> None:
        raise AssertionError(f"the report holds {word}, which is not JSON")

    report = json.loads(res.stdout, parse_constant=no_constants)
    assert report["ranks"] == [0, 1]


def test_json_with_an_integer_of_thousands_of_digits_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "digits_0"
    path.write_text('{"version": "2.10", "entries": [], "pid": ' + "7" * 5000 + "}")
    with pytest.raises(TraceInputError, match="digits_0: not a flight-recorder dump .*5000 digits"):
        load_dumps([path], workers=1)
    res = _cli("analyze", str(path))
    assert res.returncode == 2 and "internal error" not in res.stderr and "digits_0" in res.stderr


_HUGE = 10**5000  # more digits than Python turns into text


@pytest.mark.parametrize("where", [("version",), ("torchcomms", "run_id"), ("torchcomms", "host"),
                                   ("pg_config", "c0", "desc"), ("entries", 0, "profiling_name"),
                                   ("entries", 0, "state"), ("torchcomms", "ops", "0", "error")])
def test_an_integer_of_thousands_of_digits_for_a_name_is_refused(tmp_path: Path, where: tuple[Any, ...]) -> None:
    dump = _good_dump(tmp_path)
    node: Any = dump
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = _HUGE
    path = tmp_path / "digits_0"
    path.write_bytes(pickle.dumps(dump))
    with pytest.raises(TraceInputError, match="digits_0: .*Exceeds the limit"):
        load_dumps([path], workers=1)


@pytest.mark.parametrize("field,value", [("time_created_ns", _HUGE), ("time_discovered_completed_ns", -_HUGE),
                                         ("input_sizes", [[_HUGE, 2**64, 4]]), ("timeout_ms", 2**600),
                                         ("frames", [{"filename": _HUGE, "line": 2**600, "name": "f"}])],
                         ids=["created", "completed", "sizes", "timeout", "frames"])
def test_numbers_of_hundreds_of_digits_are_dropped_and_every_view_renders(tmp_path: Path, field: str, value: Any) -> None:
    dump = _good_dump(tmp_path)
    dump["entries"][0][field] = value
    dump["torchcomms"]["rank"] = _HUGE  # the rank comes from the file name
    path = tmp_path / "big_0"
    path.write_bytes(pickle.dumps(dump))
    ts = load_dumps([path], workers=1)
    op = ts.dumps[0].ops[0]
    assert op.created_ns is None or field != "time_created_ns"
    assert op.input_sizes == [[4]] or field != "input_sizes"
    assert op.frames == [{"name": "f"}] or field != "frames"
    report = analyze(ts)
    render_html(ts, report, None)
    json.dumps(to_perfetto(ts, report))
    assert _cli("analyze", str(path)).returncode == 0
