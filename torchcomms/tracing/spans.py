"""OpenTelemetry spans per op, built off the hot path.

The post-hook only queues the finished ``OpRecord`` (a C ``SimpleQueue`` put); a daemon
thread turns records into spans with their real start/end times. A full queue drops the
record but counts it: the count is logged, attached to the next span
(``torchcomms.spans_dropped``) and reported at shutdown — never silent.

A collective's spans on every rank share one trace id derived from ``(run id, comm, seq)``,
and hang under one synthetic parent span id derived the same way, so a trace backend shows
all ranks' calls of collective #N side by side.

Enabled with ``TORCHCOMM_OTEL=console`` (ConsoleSpanExporter on stderr) or
``TORCHCOMM_OTEL=file:<path>`` (OTLP JSON lines; ``{rank}`` in the path is replaced).
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import queue
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import IO, Any

from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

OTEL_ENV = "TORCHCOMM_OTEL"
QUEUE_ENV = "TORCHCOMM_OTEL_QUEUE"
DEFAULT_QUEUE = 65536


def collective_trace_id(run_id: str, comm: str, seq: int) -> int:
    """The 128-bit trace id every rank derives for collective ``seq`` of ``comm``."""
    d = hashlib.blake2b(f"{run_id}\x00{comm}\x00{seq}".encode(), digest_size=16).digest()
    return int.from_bytes(d, "big") or 1


def collective_parent_span_id(run_id: str, comm: str, seq: int) -> int:
    """The 64-bit id of the synthetic parent span of collective ``seq`` (same on all ranks)."""
    d = hashlib.blake2b(f"{run_id}\x00{comm}\x00{seq}\x00parent".encode(), digest_size=8).digest()
    return int.from_bytes(d, "big") or 1


def parse_otel_env(value: str | None) -> tuple[str, str | None] | None:
    """``None``/``""``/``off`` → None; ``console`` → ("console", None); ``file:<p>`` → ("file", p)."""
    from torchcomms import config

    return config.var(OTEL_ENV).parse(value)


def _otlp_value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [_otlp_value(x) for x in v]}}
    return {"stringValue": str(v)}


def _otlp_attrs(attrs: Any) -> list[dict[str, Any]]:
    return [{"key": k, "value": _otlp_value(v)} for k, v in (attrs or {}).items()]


def span_to_otlp(span: ReadableSpan) -> dict[str, Any]:
    """One span in OTLP/JSON encoding (hex ids, nanosecond times as strings)."""
    ctx = span.context
    out: dict[str, Any] = {
        "traceId": f"{ctx.trace_id:032x}",
        "spanId": f"{ctx.span_id:016x}",
        "name": span.name,
        "kind": int(span.kind.value) + 1,  # OTLP: INTERNAL=1, SERVER=2, ...
        "startTimeUnixNano": str(span.start_time),
        "endTimeUnixNano": str(span.end_time),
        "attributes": _otlp_attrs(span.attributes),
        "status": {"code": {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}[span.status.status_code]},
    }
    if span.parent is not None:
        out["parentSpanId"] = f"{span.parent.span_id:016x}"
    if span.status.description:
        out["status"]["message"] = span.status.description
    return out


class OTLPJsonLinesExporter(SpanExporter):
    """Append spans to a file as OTLP/JSON ``ExportTraceServiceRequest`` lines (offline)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        by_resource: dict[int, tuple[Any, list[ReadableSpan]]] = {}
        for s in spans:
            by_resource.setdefault(id(s.resource), (s.resource, []))[1].append(s)
        request = {
            "resourceSpans": [
                {
                    "resource": {"attributes": _otlp_attrs(res.attributes)},
                    "scopeSpans": [{"scope": {"name": "torchcomms"}, "spans": [span_to_otlp(s) for s in group]}],
                }
                for res, group in by_resource.values()
            ]
        }
        with self._lock:
            if self._file is None:
                return SpanExportResult.FAILURE
            self._file.write(json.dumps(request, separators=(",", ":")) + "\n")
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


_STOP = object()


class SpanRecorder:
    """Queue finished op records on the hot path; build and export spans in a thread."""

    def __init__(self, exporter: SpanExporter, *, run_id: str, rank: int | None, max_queue: int = DEFAULT_QUEUE) -> None:
        if max_queue <= 0:
            raise ValueError(f"max_queue must be > 0, got {max_queue}")
        self.run_id = run_id
        self.max_queue = max_queue
        self.dropped = 0
        self._reported_dropped = 0
        self.exported = 0
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        attrs: dict[str, Any] = {"service.name": "torchcomms", "torchcomms.run_id": run_id}
        if rank is not None:
            attrs["torchcomms.rank"] = rank
        self.provider = TracerProvider(resource=Resource.create(attrs))
        self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self._tracer = self.provider.get_tracer("torchcomms")
        self._idle = threading.Event()
        self._idle.set()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="torchcomms-spans", daemon=True)
        self._thread.start()

    # hot path ------------------------------------------------------------------------------
    def post_hook(self, op_id: int, rec: Any) -> None:
        q = self._queue
        if q.qsize() >= self.max_queue:
            self.dropped += 1
            return
        self._idle.clear()
        q.put(rec)

    # background ----------------------------------------------------------------------------
    def _run(self) -> None:
        q = self._queue
        while True:
            item = q.get()
            if item is _STOP:
                self._idle.set()
                return
            try:
                self._emit(item)
            except Exception as exc:  # noqa: BLE001 - keep the exporter thread alive
                self.dropped += 1
                _warn(f"span build failed: {type(exc).__name__}: {exc}")
            if q.empty():
                self._idle.set()

    def _emit(self, rec: Any) -> None:
        comm = str(rec.comm_name)
        seq = int(rec.seq)
        op = str(getattr(rec.name, "value", rec.name))
        parent = SpanContext(
            trace_id=collective_trace_id(self.run_id, comm, seq),
            span_id=collective_parent_span_id(self.run_id, comm, seq),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        ctx = otel_trace.set_span_in_context(NonRecordingSpan(parent))
        attrs: dict[str, Any] = {
            "torchcomms.comm": comm,
            "torchcomms.op": op,
            "torchcomms.seq": seq,
            "torchcomms.rank": int(rec.comm_ranks[rec.rank]) if rec.comm_ranks else int(rec.rank),
            "torchcomms.comm_rank": int(rec.rank),
            "torchcomms.comm_size": int(rec.size),
            "torchcomms.backend": str(rec.backend),
            "torchcomms.state": str(rec.state),
        }
        if rec.input_sizes:
            attrs["torchcomms.input_sizes"] = json.dumps(rec.input_sizes)
        if rec.input_dtypes:
            attrs["torchcomms.input_dtypes"] = [str(d) for d in rec.input_dtypes]
        if rec.peer is not None:
            attrs["torchcomms.peer"] = int(rec.peer)
        if rec.root is not None:
            attrs["torchcomms.root"] = int(rec.root)
        if self.dropped != self._reported_dropped:
            attrs["torchcomms.spans_dropped"] = self.dropped
            self._reported_dropped = self.dropped
        start = int(rec.time_started_ns or rec.time_created_ns)
        end = int(rec.time_completed_ns or start)
        span = self._tracer.start_span(f"torchcomms.{op}", context=ctx, kind=SpanKind.INTERNAL, start_time=start, attributes=attrs)
        if rec.state != "completed":
            span.set_status(Status(StatusCode.ERROR, f"{rec.state}: {rec.error}" if rec.error else str(rec.state)))
        span.end(end_time=max(end, start))
        self.exported += 1

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued record is exported."""
        return self._idle.wait(timeout)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Export what is queued, stop the thread, close the exporter; report drops."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self.provider.shutdown()
        if self.dropped:
            _warn(f"{self.dropped} spans were dropped (queue of {self.max_queue} was full)")


def _warn(message: str) -> None:
    try:
        from torchcomms.tracing.logging import get_logger

        get_logger().warning("spans", message=message)
    except Exception:  # noqa: BLE001
        print(f"torchcomms spans: {message}", file=sys.stderr)


def make_exporter(kind: str, path: str | None, rank: int | None) -> SpanExporter:
    if kind == "console":
        return ConsoleSpanExporter(out=sys.stderr)
    assert path is not None
    return OTLPJsonLinesExporter(path.replace("{rank}", str(rank if rank is not None else "x")))


_recorder: SpanRecorder | None = None
_recorder_lock = threading.Lock()
_attached: dict[int, weakref.ref[Any]] = {}


def process_span_recorder() -> SpanRecorder | None:
    """The process's span recorder from ``TORCHCOMM_OTEL`` (None when spans are off)."""
    global _recorder
    with _recorder_lock:
        if _recorder is None:
            from torchcomms.config import settings

            parsed = settings().otel
            if parsed is None:
                return None
            from torchcomms.tracing.flight_recorder import global_rank_from_env

            rank = global_rank_from_env()
            max_q = settings().otel_queue
            _recorder = SpanRecorder(make_exporter(*parsed, rank), run_id=settings().job_id, rank=rank, max_queue=max_q)
            atexit.register(_recorder.shutdown)
        return _recorder


def attach_spans(comm: Any, recorder: SpanRecorder) -> bool:
    """Emit a span for each of ``comm``'s ops through ``recorder`` (once per comm)."""
    ref = _attached.get(id(comm))
    if ref is not None and ref() is comm:
        return False
    _attached[id(comm)] = weakref.ref(comm)
    comm.register_post_hook(recorder.post_hook)
    return True


def attach_spans_from_env(comm: Any) -> None:
    rec = process_span_recorder()
    if rec is not None:
        attach_spans(comm, rec)
