"""Structured logs, OpenTelemetry spans, SIGUSR1 / at-exit dumps and the debug endpoints."""
from __future__ import annotations

import io
import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from torchcomms.tracing import logging as tlog
from torchcomms.tracing.spans import (
    OTLPJsonLinesExporter,
    SpanRecorder,
    collective_trace_id,
    parse_otel_env,
)

from tests.helpers.paths import child_pythonpath
from tests.tracing._support import REPO, Rec


def test_logs_are_json_lines_bound_with_run_rank_comm_seq(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHCOMM_RUN_ID", "run-7")
    monkeypatch.setenv("TORCHCOMM_RANK", "3")
    buf = io.StringIO()
    tlog.configure_logging(level="debug", fmt="json", log_dir=tmp_path, stream=buf, force=True)
    try:
        hook = tlog.LogHook("dp")
        r = Rec("dp", (0, 1, 2, 3), 3, "all_reduce", 5).complete()
        hook.pre("all_reduce", 11, r)
        hook.post(11, r)
        t = Rec("dp", (0, 1, 2, 3), 3, "broadcast", 6).start()
        t.state, t.error = "timed_out", "did not complete within 1 s"
        hook.post(12, t)
        hook.abort()
        lines = [json.loads(x) for x in buf.getvalue().splitlines()]
        assert [x["event"] for x in lines] == ["op_start", "op_done", "op_timeout", "comm_abort"]
        assert [x["level"] for x in lines] == ["debug", "debug", "error", "warning"]
        for x in lines:
            assert x["run_id"] == "run-7" and x["rank"] == 3 and x["comm"] == "dp" and x["pid"] == os.getpid()
            assert x["host"] == socket.gethostname() and x["timestamp"].endswith("Z")
        assert lines[0]["seq"] == 5 and lines[2]["seq"] == 6 and lines[2]["error"] == "did not complete within 1 s"
        assert lines[1]["duration_ms"] == pytest.approx(1.0)
        per_rank = (tmp_path / "torchcomms-rank3.jsonl").read_text().splitlines()
        assert [json.loads(x)["event"] for x in per_rank] == ["op_start", "op_done", "op_timeout", "comm_abort"]
        # At info level ops are not logged, lifecycle events are.
        buf2 = io.StringIO()
        tlog.configure_logging(level="info", fmt="json", stream=buf2, force=True)
        hook2 = tlog.LogHook("dp")
        hook2.pre("all_reduce", 1, r)
        hook2.post(1, r)
        hook2.pre("finalize", 2, Rec("dp", (0, 1), 0, "finalize", 7))
        assert [json.loads(x)["event"] for x in buf2.getvalue().splitlines()] == ["comm_finalize"]
    finally:
        tlog.configure_logging(force=True)


_QUIET_RANK_SCRIPT = r"""
import json, sys, torch, torchcomms
from torchcomms.tracing.logging import get_logger
c = torchcomms.new_comm("fake", "cpu", "quiet", hints={"rank": "0", "size": "2"})
c.all_reduce(torch.ones(4), torchcomms.ReduceOp.SUM, async_op=False)
c.finalize()
print(json.dumps({"structlog_before": "structlog" in sys.modules, "rich_before": "rich" in sys.modules}))
get_logger(comm="quiet").info("below_the_level")
print(json.dumps({"after_info": "structlog" in sys.modules}))
get_logger(comm="quiet").bind(step=4).warning("probe", n=1)
print(json.dumps({"after_warning": "structlog" in sys.modules}))
"""


def test_a_rank_that_logs_nothing_at_its_level_never_imports_structlog(tmp_path: Path) -> None:
    """structlog (and rich, which it imports) is paid for at the first event at or above the
    level: a communicator's life at the default level (warning) logs nothing, so never."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHCOMM_LOG")}
    env.update(PYTHONPATH=child_pythonpath(), TORCHCOMM_RUN_ID="quiet-run", TORCHCOMM_LOG_FORMAT="json")
    res = subprocess.run([sys.executable, "-c", _QUIET_RANK_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    states = {k: v for line in res.stdout.splitlines() for k, v in json.loads(line).items()}
    assert states == {"structlog_before": False, "rich_before": False, "after_info": False,
                      "after_warning": True}, res.stdout
    events = [json.loads(line) for line in res.stderr.splitlines() if line.startswith("{")]
    assert [(e["event"], e["level"]) for e in events] == [("probe", "warning")], res.stderr
    assert events[0]["comm"] == "quiet" and events[0]["step"] == 4 and events[0]["n"] == 1, events
    assert events[0]["run_id"] == "quiet-run", events


def test_log_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="log level"):
        tlog.configure_logging(level="loud", force=True)
    with pytest.raises(ValueError, match="log format"):
        tlog.configure_logging(fmt="xml", force=True)
    tlog.configure_logging(force=True)


def test_otel_env_parsing() -> None:
    assert parse_otel_env(None) is None and parse_otel_env("") is None and parse_otel_env("off") is None
    assert parse_otel_env("console") == ("console", None)
    assert parse_otel_env("file:/tmp/x.jsonl") == ("file", "/tmp/x.jsonl")
    with pytest.raises(ValueError, match="TORCHCOMM_OTEL"):
        parse_otel_env("jaeger")
    with pytest.raises(ValueError, match="needs a path"):
        parse_otel_env("file:")


def test_spans_of_one_collective_share_a_trace_id_across_ranks(tmp_path: Path) -> None:
    files = []
    for rank in (0, 1):
        path = tmp_path / f"spans-{rank}.jsonl"
        rec = SpanRecorder(OTLPJsonLinesExporter(path), run_id="run-9", rank=rank)
        for seq in (1, 2):
            r = Rec("dp", (0, 1), rank, "all_reduce", seq).complete(3_000_000)
            rec.post_hook(seq, r)
        bad = Rec("dp", (0, 1), rank, "barrier", 3, sizes=[]).start()
        bad.state, bad.error = "failed", "peer died"
        rec.post_hook(3, bad)
        assert rec.flush(10)
        rec.shutdown()
        files.append(path)
    spans: dict[int, list[dict]] = {}
    for rank, path in enumerate(files):
        reqs = [json.loads(x) for x in path.read_text().splitlines()]
        spans[rank] = [s for q in reqs for rs in q["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
        res_attrs = {a["key"]: a["value"] for q in reqs for rs in q["resourceSpans"] for a in rs["resource"]["attributes"]}
        assert res_attrs["torchcomms.rank"] == {"intValue": str(rank)}
    assert [len(v) for v in spans.values()] == [3, 3]
    for i in range(3):
        a, b = spans[0][i], spans[1][i]
        assert a["traceId"] == b["traceId"] and a["parentSpanId"] == b["parentSpanId"] and a["spanId"] != b["spanId"]
        seq = i + 1
        assert int(a["traceId"], 16) == collective_trace_id("run-9", "dp", seq)
    assert spans[0][0]["traceId"] != spans[0][1]["traceId"]
    s = spans[0][0]
    assert s["name"] == "torchcomms.all_reduce"
    assert int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) == 3_000_000
    assert spans[0][2]["status"] == {"code": 2, "message": "failed: peer died"}


def test_full_span_queue_counts_and_reports_drops(tmp_path: Path) -> None:
    rec = SpanRecorder(OTLPJsonLinesExporter(tmp_path / "s.jsonl"), run_id="r", rank=0, max_queue=1)
    rec._queue.put(object.__new__(object))  # occupy the queue: the thread is busy with it
    for seq in range(5):
        rec.post_hook(seq, Rec("dp", (0, 1), 0, "all_reduce", seq).complete())
    assert rec.dropped >= 4
    rec.shutdown()
    with pytest.raises(ValueError, match="max_queue"):
        SpanRecorder(OTLPJsonLinesExporter(tmp_path / "t.jsonl"), run_id="r", rank=0, max_queue=0)


_SIGNAL_SCRIPT = r"""
import os, signal, sys, time, torch, torchcomms
calls = []
signal.signal(signal.SIGUSR1, lambda s, f: calls.append(s))  # a handler the app had before
c = torchcomms.new_comm("fake", "cpu", "sig", hints={"rank": "1", "size": "2"})
c.all_reduce(torch.ones(4), torchcomms.ReduceOp.SUM, async_op=False)
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.2)
print("chained", calls == [signal.SIGUSR1])
c.barrier(async_op=False)
"""


def test_sigusr1_dumps_and_chains_and_exit_dump(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), TORCHCOMM_FR_DUMP_TEMP_FILE=str(tmp_path / "fr_"),
               TORCHCOMM_FR_DUMP_ON_EXIT="0", TORCHCOMM_RUN_ID="sig-run")
    res = subprocess.run([sys.executable, "-c", _SIGNAL_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "chained True" in res.stdout
    with open(tmp_path / "fr_1", "rb") as f:
        d = pickle.load(f)
    assert d["torchcomms"]["reason"] == "signal:SIGUSR1" and len(d["entries"]) == 1  # before the barrier
    env["TORCHCOMM_FR_DUMP_ON_EXIT"] = "1"
    res = subprocess.run([sys.executable, "-c", _SIGNAL_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(tmp_path / "fr_1", "rb") as f:
        d = pickle.load(f)
    assert d["torchcomms"]["reason"] == "exit" and [e["profiling_name"] for e in d["entries"]] == ["fake:all_reduce", "fake:barrier"]


_DEBUG_SCRIPT = r"""
import http.client, json, socket, sys, torch, torchcomms
from torch._C._distributed_c10d import _WorkerServer
c = torchcomms.new_comm("fake", "cpu", "dbg", hints={"rank": "0", "size": "2"})
c.all_reduce(torch.ones(4), torchcomms.ReduceOp.SUM, async_op=False)
server = _WorkerServer(sys.argv[1])
class UnixConn(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(sys.argv[1])
out = {}
for name in ("torchcomms_fr_trace_json", "torchcomms_health_check", "torchcomms_fr_dump_file"):
    conn = UnixConn("localhost")
    conn.request("POST", "/handler/" + name)
    r = conn.getresponse()
    out[name] = [r.status, json.loads(r.read())]
c.abort()
conn = UnixConn("localhost")
conn.request("POST", "/handler/torchcomms_health_check")
out["after_abort"] = json.loads(conn.getresponse().read())
server.shutdown()
print(json.dumps(out))
"""


def test_debug_endpoints_answer_through_torchs_worker_server(tmp_path: Path) -> None:
    sock = tmp_path / "w.sock"
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), TORCHCOMM_FR_DUMP_TEMP_FILE=str(tmp_path / "fr_"))
    res = subprocess.run([sys.executable, "-c", _DEBUG_SCRIPT, str(sock)], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    status, trace = out["torchcomms_fr_trace_json"]
    assert status == 200 and trace["version"] == "2.10" and trace["entries"][0]["profiling_name"] == "fake:all_reduce"
    status, health = out["torchcomms_health_check"]
    assert status == 200 and health["healthy"] is True and health["comms"] == [{"name": "dbg", "state": "active"}]
    status, dumped = out["torchcomms_fr_dump_file"]
    assert status == 200 and dumped["path"] == str(tmp_path / "fr_0") and (tmp_path / "fr_0").exists()
    assert out["after_abort"]["healthy"] is False and "comm 'dbg' is aborted" in out["after_abort"]["problems"]
