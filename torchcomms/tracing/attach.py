"""Default tracing for every communicator: ``attach_default_tracing(comm)``.

``new_comm`` calls it for each communicator it creates; it is idempotent and follows comms
split later. Controlled by the environment:

* ``TORCHCOMM_FR_MAX_ENTRIES`` (default 2048; 0 turns the flight recorder off);
* ``TORCHCOMM_FR_DUMP_TEMP_FILE`` dump path prefix (rank appended); dumps are written on
  timeout, peer failure, abort, SIGUSR1, and at exit when ``TORCHCOMM_FR_DUMP_ON_EXIT=1``;
* ``TORCHCOMM_LOG_EVENTS`` (default 1) structured log events, ``TORCHCOMM_LOG_LEVEL``,
  ``TORCHCOMM_LOG_DIR`` (see :mod:`torchcomms.tracing.logging`);
* ``TORCHCOMM_OTEL`` = ``console`` | ``file:<path>`` turns OpenTelemetry spans on.
"""
from __future__ import annotations

import atexit
import os
import signal
import threading
import time
import weakref
from typing import Any

from torchcomms import config
from torchcomms.config import settings
from torchcomms.tracing.flight_recorder import FlightRecorder, process_recorder

DUMP_ON_EXIT_ENV = "TORCHCOMM_FR_DUMP_ON_EXIT"
LOG_EVENTS_ENV = "TORCHCOMM_LOG_EVENTS"

_lock = threading.RLock()
_attached: dict[int, weakref.ref[Any]] = {}
_process_hooks_installed = False
_previous_sigusr1: Any = None
_last_failure: dict[Any, tuple[str, float]] = {}  # comm name -> (dump reason, monotonic time)
_FAILURE_ABORT_WINDOW_S = 5.0


def _truthy(var: str, default: bool) -> bool:
    """The declared boolean ``var`` (see ``torchcomms.config``); ``default`` when unset."""
    raw = os.environ.get(var)
    return default if raw is None or raw.strip() == "" else bool(config.var(var).parse(raw))


class _Follower:
    """Observer: give every comm split from a traced one the same tracing."""

    def on_new_comm(self, child: Any) -> None:
        attach_default_tracing(child)


_FOLLOWER = _Follower()


def attach_default_tracing(comm: Any) -> None:
    """Attach the flight recorder, log events and (when enabled) spans to ``comm``.

    Safe to call more than once per communicator; comms split from ``comm`` later are
    traced too.
    """
    with _lock:
        ref = _attached.get(id(comm))
        if ref is not None and ref() is comm:
            return
        _attached[id(comm)] = weakref.ref(comm)
        recorder = process_recorder()
        _install_process_hooks(recorder)
    if recorder.enabled:
        recorder.attach(comm)
        comm.register_abort_hook(_make_abort_dump(recorder, comm))
    if settings().log_events:
        from torchcomms.tracing.logging import attach_logging

        attach_logging(comm)
    if settings().otel is not None:  # keep OpenTelemetry unimported when off
        from torchcomms.tracing.spans import attach_spans_from_env

        attach_spans_from_env(comm)
    add_observer = getattr(comm, "add_observer", None)
    if add_observer is not None:
        add_observer(_FOLLOWER)


def _make_abort_dump(recorder: FlightRecorder, comm: Any) -> Any:
    comm_ref = weakref.ref(comm)

    def _on_abort() -> None:
        c = comm_ref()
        name = None
        if c is not None:
            try:
                name = c.get_name()
            except Exception:  # noqa: BLE001
                name = None
        reason = f"abort:{name}" if name else "abort"
        recent, at = _last_failure.get(name, ("", 0.0))
        if recent and time.monotonic() - at < _FAILURE_ABORT_WINDOW_S:
            reason = f"{recent} (then {reason})"  # the abort follows that failure: keep the cause
        safe_dump(recorder, reason)

    return _on_abort


def safe_dump(recorder: FlightRecorder, reason: str) -> None:
    """Write the process dump; never raise (it runs from hooks, signals and atexit)."""
    try:
        recorder.dump_file(reason=reason)
    except Exception as exc:  # noqa: BLE001 - a failed dump must not hide the real failure
        try:
            from torchcomms.tracing.logging import get_logger

            get_logger().error("fr_dump_failed", reason=reason, error=f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001
            pass


def _install_process_hooks(recorder: FlightRecorder) -> None:
    global _process_hooks_installed, _previous_sigusr1
    if _process_hooks_installed:
        return
    _process_hooks_installed = True
    if not recorder.enabled:
        return
    def _on_failure(state: str, rec: Any) -> None:
        reason = f"{state}:{rec.comm_name}:{rec.name}#{rec.seq}"
        _last_failure[rec.comm_name] = (reason, time.monotonic())
        safe_dump(recorder, reason)

    recorder.add_failure_listener(_on_failure)
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR1"):
        previous = signal.getsignal(signal.SIGUSR1)

        def _on_sigusr1(signum: int, frame: Any) -> None:
            safe_dump(recorder, "signal:SIGUSR1")
            if callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN):
                previous(signum, frame)

        _previous_sigusr1 = previous
        signal.signal(signal.SIGUSR1, _on_sigusr1)
    if settings().fr_dump_on_exit:
        atexit.register(safe_dump, recorder, "exit")
    try:
        from torchcomms.tracing.debug_handlers import register_debug_handlers

        register_debug_handlers()
    except Exception:  # noqa: BLE001 - the debug server is optional
        pass
