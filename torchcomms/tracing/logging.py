"""Structured logs for torchcomms: structlog, one JSON line per event.

torchcomms keeps its own structlog pipeline (``structlog.wrap_logger``) instead of calling
``structlog.configure``, so an application's own structlog set-up is left alone. Events are
bound with run id, host, pid and rank; op events add comm, op and seq.

* ops (start, done) at debug level; lifecycle (init, split, finalize, abort, timeout,
  failure) at info / warning / error;
* JSON lines on stderr, or a colour console renderer when stderr is a TTY;
* ``TORCHCOMM_LOG_LEVEL`` (default ``warning``: lifecycle info lines need ``info``), ``TORCHCOMM_LOG_FORMAT`` (``json`` |
  ``console`` | ``auto``), ``TORCHCOMM_LOG_DIR`` (also write ``<dir>/torchcomms-rank<r>.jsonl``).

structlog (which imports rich) is imported at the first event at or above the level, not before:
a rank at the default level that never warns does not pay for that import (0.15 s of CPU).
"""
from __future__ import annotations

import json
import logging as _stdlib_logging
import os
import socket
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import IO, Any

from torchcomms.config import settings

LEVEL_ENV = "TORCHCOMM_LOG_LEVEL"
FORMAT_ENV = "TORCHCOMM_LOG_FORMAT"
LOG_DIR_ENV = "TORCHCOMM_LOG_DIR"

_LEVELS = {
    "debug": _stdlib_logging.DEBUG,
    "info": _stdlib_logging.INFO,
    "warning": _stdlib_logging.WARNING,
    "error": _stdlib_logging.ERROR,
    "critical": _stdlib_logging.CRITICAL,
}
_FORMATS = ("json", "console", "auto")
_LIFECYCLE_OPS = frozenset({"split", "finalize", "shrink"})


class _Sink:
    """structlog's final "logger": renders the event dict to the stream and the rank file."""

    def __init__(self, stream: IO[str], console: bool, file_path: Path | None) -> None:
        self._stream = stream
        self._console: Any = None
        if console:
            import structlog

            self._console = structlog.dev.ConsoleRenderer(colors=True)
        self._file: IO[str] | None = None
        self.file_path = file_path
        if file_path is not None:
            file_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(file_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self._lock = threading.Lock()

    def _emit(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, default=str, separators=(",", ":"))
        text = self._console(None, "", dict(event)) if self._console is not None else line
        with self._lock:
            try:
                self._stream.write(text + "\n")
                self._stream.flush()
            except (ValueError, OSError):  # stream closed at interpreter exit
                pass
            if self._file is not None:
                try:
                    self._file.write(line + "\n")
                except (ValueError, OSError):
                    pass

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    debug = info = warning = warn = error = critical = exception = fatal = msg = lambda self, event: self._emit(event)  # noqa: E731


def _to_sink(logger: Any, method: str, event_dict: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (event_dict,), {}


class _Config:
    def __init__(self, level: int, sink: _Sink, context: dict[str, Any]) -> None:
        self.level = level
        self.sink = sink
        self.context = context
        self._logger: Any = None
        self._lock = threading.Lock()

    def structlog_logger(self) -> Any:
        """The structlog pipeline, built (and structlog imported) on first use."""
        if self._logger is None:
            with self._lock:
                if self._logger is None:
                    import structlog

                    self._logger = structlog.wrap_logger(
                        self.sink,
                        processors=[
                            structlog.processors.add_log_level,
                            structlog.processors.TimeStamper(fmt="iso", utc=True),
                            structlog.processors.format_exc_info,
                            _to_sink,
                        ],
                        wrapper_class=structlog.make_filtering_bound_logger(self.level),
                        context_class=dict,
                    ).bind(**self.context)
        return self._logger


class BoundLog:
    """torchcomms' logger with its bound fields: events below the level cost one comparison;
    the first one at or above it builds the structlog pipeline, which renders it."""

    __slots__ = ("_config", "_fields")

    def __init__(self, config: _Config, fields: dict[str, Any]) -> None:
        self._config = config
        self._fields = fields

    def bind(self, **fields: Any) -> BoundLog:
        return BoundLog(self._config, {**self._fields, **fields})

    def _log(self, method: str, level: int, event: str, fields: dict[str, Any]) -> None:
        if level < self._config.level:
            return
        logger = self._config.structlog_logger()
        if self._fields:
            logger = logger.bind(**self._fields)
        getattr(logger, method)(event, **fields)

    def debug(self, event: str, **fields: Any) -> None:
        self._log("debug", _stdlib_logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log("info", _stdlib_logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log("warning", _stdlib_logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log("error", _stdlib_logging.ERROR, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An error event with the exception being handled (``exc_info``)."""
        self._log("exception", _stdlib_logging.ERROR, event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        self._log("critical", _stdlib_logging.CRITICAL, event, fields)


_config: _Config | None = None
_config_lock = threading.Lock()


def _parse_level(raw: str | int | None) -> int:
    if raw is None:
        raw = settings().log_level
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    key = str(raw).strip().lower()
    if key not in _LEVELS:
        raise ValueError(f"log level must be one of {sorted(_LEVELS)}, got {raw!r} (from {LEVEL_ENV} or level=)")
    return _LEVELS[key]


def _rank() -> int | None:
    from torchcomms.tracing.flight_recorder import global_rank_from_env

    return global_rank_from_env()


def configure_logging(
    *,
    level: str | int | None = None,
    fmt: str | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    stream: IO[str] | None = None,
    force: bool = False,
) -> None:
    """Set torchcomms' log pipeline up (once; ``force=True`` replaces it).

    Arguments default to ``TORCHCOMM_LOG_LEVEL`` / ``TORCHCOMM_LOG_FORMAT`` /
    ``TORCHCOMM_LOG_DIR``; ``stream`` defaults to stderr.
    """
    global _config
    with _config_lock:
        if _config is not None and not force:
            return
        lvl = _parse_level(level)
        fmt = (fmt or settings().log_format).strip().lower()
        if fmt not in _FORMATS:
            raise ValueError(f"log format must be one of {_FORMATS}, got {fmt!r} (from {FORMAT_ENV} or fmt=)")
        out = stream if stream is not None else sys.stderr
        console = fmt == "console" or (fmt == "auto" and hasattr(out, "isatty") and out.isatty())
        rank = _rank()
        if log_dir is None:
            log_dir = settings().log_dir
        file_path = Path(log_dir) / f"torchcomms-rank{rank if rank is not None else 'x'}.jsonl" if log_dir else None

        context = {"run_id": settings().job_id, "host": socket.gethostname(), "pid": os.getpid(), "rank": rank}
        if _config is not None:
            _config.sink.close()
        _config = _Config(lvl, _Sink(out, console, file_path), context)


def get_logger(**bind: Any) -> BoundLog:
    """torchcomms' logger with ``bind`` fields (configured from the environment on first use)."""
    if _config is None:
        configure_logging()
    assert _config is not None
    return BoundLog(_config, bind)


def is_debug_enabled() -> bool:
    if _config is None:
        configure_logging()
    assert _config is not None
    return _config.level <= _stdlib_logging.DEBUG


class LogHook:
    """Pre/post/abort hooks that turn a communicator's ops into log events."""

    def __init__(self, comm_name: str) -> None:
        self.comm_name = comm_name
        self._log = get_logger(comm=comm_name)
        self._debug = is_debug_enabled()

    def pre(self, name: Any, op_id: int, rec: Any) -> None:
        if not self._debug and name not in _LIFECYCLE_OPS:  # the common case: nothing to log
            return
        op = getattr(name, "value", name)
        if op in _LIFECYCLE_OPS:
            self._log.info(f"comm_{op}", op=op, seq=rec.seq, op_id=op_id)
        elif self._debug:
            self._log.debug(
                "op_start", op=op, seq=rec.seq, op_id=op_id, input_sizes=rec.input_sizes,
                input_dtypes=rec.input_dtypes, peer=rec.peer, root=rec.root, timeout_s=rec.timeout_s,
            )

    def post(self, op_id: int, rec: Any) -> None:
        state = rec.state
        if state == "completed":
            if self._debug:
                self._log.debug("op_done", op=str(rec.name), seq=rec.seq, op_id=op_id, duration_ms=rec.duration_ms)
        elif state == "timed_out":
            self._log.error("op_timeout", op=str(rec.name), seq=rec.seq, op_id=op_id, timeout_s=rec.timeout_s, error=rec.error)
        elif state == "failed":
            self._log.error("op_failed", op=str(rec.name), seq=rec.seq, op_id=op_id, error=rec.error)
        elif state == "aborted" and self._debug:
            self._log.debug("op_aborted", op=str(rec.name), seq=rec.seq, op_id=op_id, error=rec.error)

    def abort(self) -> None:
        self._log.warning("comm_abort")


_attached: dict[int, weakref.ref[Any]] = {}


def attach_logging(comm: Any, *, parent: str | None = None) -> LogHook | None:
    """Log ``comm``'s lifecycle (and ops at debug level); returns None if already attached."""
    ref = _attached.get(id(comm))
    if ref is not None and ref() is comm:
        return None
    _attached[id(comm)] = weakref.ref(comm)
    name = str(comm.get_name())
    hook = LogHook(name)
    comm.register_pre_hook(hook.pre)
    comm.register_post_hook(hook.post)
    comm.register_abort_hook(hook.abort)
    fields: dict[str, Any] = {}
    for key, getter in (("comm_rank", "get_rank"), ("comm_size", "get_size"), ("backend", "get_backend")):
        try:
            fields[key] = getattr(comm, getter)()
        except Exception:  # noqa: BLE001
            pass
    hook._log.info("comm_init", ts_ns=time.time_ns(), **fields)
    return hook
