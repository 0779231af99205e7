"""Flight recorder ring, the FR "2.10" dump, FlightRecorderHook and auto-dumps on a real comm."""
from __future__ import annotations

import json
import pickle
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch

import torchcomms
from torchcomms.hooks import FlightRecorderHook, NanCheckHook
from torchcomms.tracing import fr_format
from torchcomms.tracing.flight_recorder import FlightRecorder

from tests.tracing._support import Rec, feed

ENTRY_KEYS = {
    "record_id", "pg_id", "process_group", "thread_name", "thread_id", "collective_seq_id", "p2p_seq_id", "op_id",
    "profiling_name", "time_created_ns", "duration_ms", "input_sizes", "input_dtypes", "output_sizes",
    "output_dtypes", "state", "time_discovered_started_ns", "time_discovered_completed_ns", "retired",
    "timeout_ms", "is_p2p", "frames",
}


def _fake(name: str, **hints: str) -> torchcomms.TorchComm:
    return torchcomms.new_comm("fake", "cpu", name, hints={"rank": "0", "size": "2", **hints}, timeout=timedelta(seconds=0.3))


def test_ring_is_bounded_and_keeps_the_newest() -> None:
    fr = FlightRecorder(5)
    feed(fr, [Rec("dp", (0, 1), 0, "all_reduce", s, op_id=s).complete() for s in range(1, 13)])
    assert fr.size() == 5
    seqs = [e["collective_seq_id"] for e in fr.dump()["entries"]]
    assert seqs == [8, 9, 10, 11, 12]
    ids = [e["record_id"] for e in fr.dump()["entries"]]
    assert ids == sorted(ids) and len(set(ids)) == 5
    fr.reset()
    assert fr.size() == 0 and fr.dump()["entries"] == []


def test_dump_has_the_2_10_format_with_pg_config_and_status() -> None:
    fr = FlightRecorder(16)
    recs = [
        Rec("dp", (0, 2), 1, "all_reduce", 1, sizes=[[4, 8]]).complete(2_000_000),
        Rec("dp", (0, 2), 1, "send", 1, is_p2p=True, peer=0),
        Rec("dp", (0, 2), 1, "broadcast", 2, root=0).start(),
    ]
    feed(fr, recs)
    d = fr.dump(reason="test")
    assert d["version"] == "2.10" and d["comm_lib_version"].startswith("torchcomms")
    assert d["pg_config"] == {"dp": {"name": "dp", "desc": "dp", "ranks": "[0, 2]"}}
    assert d["pg_status"]["dp"] == {"last_enqueued_collective": 2, "last_started_collective": 2, "last_completed_collective": 1}
    for e in d["entries"]:
        assert set(e) == ENTRY_KEYS
    e0, e1, e2 = d["entries"]
    assert e0["profiling_name"] == "gloo:all_reduce" and e0["state"] == "completed" and e0["retired"] is True
    assert e0["duration_ms"] == pytest.approx(2.0) and e0["input_sizes"] == [[4, 8]] and e0["input_dtypes"] == ["float32"]
    assert e0["timeout_ms"] == 30000 and e0["process_group"] == ["dp", "dp"]
    assert e1["profiling_name"] == "gloo:send 1->0" and e1["is_p2p"] is True
    assert e1["p2p_seq_id"] == fr_format.P2P_SEQ_BASE + 1 and e0["p2p_seq_id"] == 0
    assert e1["collective_seq_id"] == 1  # a p2p entry carries the last collective seq
    assert e2["state"] == "started" and e2["time_discovered_completed_ns"] is None and e2["retired"] is False
    assert d["torchcomms"]["reason"] == "test" and d["torchcomms"]["rank"] == 2  # global rank of comm rank 1
    assert d["torchcomms"]["ops"][str(e2["record_id"])]["root"] == 0
    json.loads(fr.dump_json())  # JSON-serialisable
    assert [e["state"] for e in fr.dump(include_completed=False)["entries"]] == ["scheduled", "started"]


def test_failed_states_map_to_pytorch_states_and_keep_ours() -> None:
    fr = FlightRecorder(4)
    r = Rec("dp", (0, 1), 0, "all_reduce", 1).start()
    r.state, r.error = "timed_out", "did not complete within 1 s"
    feed(fr, [r])
    d = fr.dump()
    assert d["entries"][0]["state"] == "started"
    assert d["torchcomms"]["ops"]["0"]["state"] == "timed_out"
    assert d["torchcomms"]["ops"]["0"]["error"] == "did not complete within 1 s"


def test_dump_file_is_a_plain_pickle_written_atomically(tmp_path: Path) -> None:
    fr = FlightRecorder(8)
    feed(fr, [Rec("dp", (0, 1), 0, "all_reduce", 1).complete()])
    path = fr.dump_file(3, prefix=str(tmp_path / "trace_"))
    assert path == tmp_path / "trace_3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace_3"]  # no temporary left
    with open(path, "rb") as f:
        d = pickle.load(f)
    assert d["version"] == "2.10" and len(d["entries"]) == 1


def test_dump_path_follows_the_env_prefix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHCOMM_FR_DUMP_TEMP_FILE", str(tmp_path / "x_"))
    assert fr_format.dump_path(7) == tmp_path / "x_7"
    monkeypatch.delenv("TORCHCOMM_FR_DUMP_TEMP_FILE")
    monkeypatch.setenv("TORCHCOMM_RUN_ID", "job-7")
    assert str(fr_format.dump_path(0)).endswith(".cache/torch/comm_lib_trace/job-7/rank_0")  # one folder per job


def test_recorder_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        FlightRecorder(-1)
    with pytest.raises(TypeError, match="max_entries"):
        FlightRecorder("10")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stack_depth"):
        FlightRecorder(4, stack_depth=-2)
    with pytest.raises(ValueError, match="rank"):
        FlightRecorder(4).dump_file(-1)


def test_hook_records_a_real_comm_with_call_sites_and_follows_splits() -> None:
    hook = FlightRecorderHook(max_entries=64, isolated=True)
    comm = _fake("fr-hook-1")
    hook.register_with_comm(comm)
    t = torch.ones(8)
    comm.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=False)  # the call site we expect
    line = __import__("inspect").currentframe().f_lineno - 1
    sub = comm.split([0, 1], "fr-hook-1-sub")
    assert sub is not None
    sub.broadcast(t, 0, async_op=False)
    d = json.loads(hook.dump_json())
    names = [(e["process_group"][0], e["profiling_name"], e["state"]) for e in d["entries"]]
    assert names == [("fr-hook-1", "fake:all_reduce", "completed"), ("fr-hook-1", "fake:split", "completed"),
                     ("fr-hook-1-sub", "fake:broadcast", "completed")]
    frame = d["entries"][0]["frames"][0]
    assert frame["filename"] == __file__ and frame["line"] == line
    assert set(d["pg_config"]) == {"fr-hook-1", "fr-hook-1-sub"}
    assert hook.size() == 3 and hook.is_enabled()
    hook.reset()
    assert hook.size() == 0
    comm.finalize()
    sub.finalize()


def test_hook_with_zero_entries_is_disabled_and_validates() -> None:
    hook = FlightRecorderHook(max_entries=0)
    comm = _fake("fr-hook-2")
    hook.register_with_comm(comm)
    comm.barrier(async_op=False)
    assert not hook.is_enabled() and hook.size() == 0
    assert json.loads(hook.dump_json())["entries"] == []
    with pytest.raises(ValueError, match="max_entries"):
        FlightRecorderHook(max_entries=-5)
    with pytest.raises(TypeError, match="isolated"):
        FlightRecorderHook(isolated="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="communicator"):
        FlightRecorderHook().register_with_comm(object())
    comm.finalize()


def test_shared_hooks_do_not_record_twice() -> None:
    a, b = FlightRecorderHook(128), FlightRecorderHook(128)
    comm = _fake("fr-hook-3")  # default tracing already attached the process recorder
    a.register_with_comm(comm)
    b.register_with_comm(comm)
    before = a.size()
    comm.barrier(async_op=False)
    assert a.size() == before + 1 or a.size() == a.recorder.max_entries
    comm.finalize()


def test_timeout_writes_a_dump_naming_the_cause(job_env: Path) -> None:
    comm = _fake("fr-auto-1", **{"fake.hang_ops": "all_reduce"})
    with pytest.raises(torchcomms.CommTimeoutError):
        comm.all_reduce(torch.ones(4), torchcomms.ReduceOp.SUM, async_op=False)
    path = job_env / "fr_rank_0"
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(path, "rb") as f:
        d = pickle.load(f)
    assert d["torchcomms"]["reason"].startswith("timed_out:fr-auto-1:all_reduce#")
    mine = [e for e in d["entries"] if e["process_group"][0] == "fr-auto-1"]
    assert mine[-1]["profiling_name"] == "fake:all_reduce" and mine[-1]["state"] == "started"
    comm.finalize()


def test_op_ended_for_the_caller_but_not_in_the_engine_is_dumped_as_started() -> None:
    """A timeout fails the caller while the engine still holds the op: the dump says started
    and in the engine, with the caller's outcome beside it; once the engine returns, it says
    timed out. It used to say "timed_out" (retired) while the engine was still inside."""
    hook = FlightRecorderHook(max_entries=16, isolated=True)
    comm = _fake("fr-blocked-1", **{"fake.hang_ops": "all_reduce"})
    hook.register_with_comm(comm)
    with pytest.raises(torchcomms.CommTimeoutError):
        comm.all_reduce(torch.ones(4), torchcomms.ReduceOp.SUM, async_op=False)

    def entry() -> tuple[dict, dict]:
        d = json.loads(hook.dump_json())
        (e,) = d["entries"]
        return e, d["torchcomms"]["ops"][str(e["record_id"])]

    e, x = entry()
    assert (e["state"], e["retired"], e["time_discovered_completed_ns"]) == ("started", False, None)
    assert (x["state"], x["outcome"], x["in_engine"]) == ("started", "timed_out", True)
    assert "did not complete within" in x["error"]
    comm._backend._pending[0].set_result(None)  # the engine returns, too late for the caller
    e, x = entry()
    assert (e["state"], e["retired"]) == ("started", True)
    assert (x["state"], x["outcome"], x["in_engine"]) == ("timed_out", None, False)
    comm.finalize()


def test_abort_writes_a_dump(job_env: Path) -> None:
    comm = _fake("fr-auto-2")
    comm.barrier(async_op=False)
    comm.abort()
    with open(job_env / "fr_rank_0", "rb") as f:
        d = pickle.load(f)
    assert d["torchcomms"]["reason"] == "abort:fr-auto-2"


def test_nan_check_hook_raises_before_dispatch() -> None:
    hook = NanCheckHook()
    r = Rec("dp", (0, 1), 0, "all_reduce", 1)
    r.extra = {"inputs": [torch.tensor([1.0, float("nan")])]}
    with pytest.raises(torchcomms.CommValueError, match="NaN") as ei:
        hook("all_reduce", 1, r)
    assert isinstance(ei.value, ValueError) and "all_reduce #1" in str(ei.value)
    r.extra = {"inputs": [torch.tensor([1.0, 2.0]), torch.tensor([1, 2])]}
    hook("all_reduce", 2, r)  # no NaN: no error
    with pytest.raises(TypeError, match="communicator"):
        hook.register_with_comm(None)


def test_nan_check_on_a_real_comm_raises_or_says_it_cannot() -> None:
    import io

    from torchcomms.tracing import logging as tlog

    buf = io.StringIO()
    tlog.configure_logging(fmt="json", stream=buf, force=True)
    try:
        comm = _fake("nan-real")
        NanCheckHook().register_with_comm(comm)
        try:
            comm.all_reduce(torch.tensor([1.0, float("nan")]), torchcomms.ReduceOp.SUM, async_op=False)
        except torchcomms.CommValueError as exc:
            assert "NaN" in str(exc)
        else:
            events = [json.loads(x)["event"] for x in buf.getvalue().splitlines()]
            assert "nan_check_inactive" in events
        comm.finalize()
    finally:
        tlog.configure_logging(force=True)
