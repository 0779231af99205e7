"""Tracing for torchcomms.

The in-process recorders (flight recorder, structured logs, OpenTelemetry spans, the debug
handlers) observe communicators only through the dispatch path's hooks; the core never imports
them beyond :func:`attach_default_tracing`. The offline viewer behind ``torchcomms-trace``
lives in :mod:`torchcomms.tracing.viewer`, which this package does not import.

The names below are imported on first use (PEP 562): torch's import-time probe imports
``torchcomms.hooks.FlightRecorderHook`` on every ``import torch``, and the recorder itself is
loaded only when a hook is made.
"""
from __future__ import annotations

from torchcomms._lazy import lazy_exports

_EXPORTS = {
    "attach_default_tracing": "torchcomms.tracing.attach",
    "FlightRecorder": "torchcomms.tracing.flight_recorder",
    "process_recorder": "torchcomms.tracing.flight_recorder",
    "FORMAT_VERSION": "torchcomms.tracing.fr_format",
    "FlightRecorderHook": "torchcomms.tracing.fr_hook",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("torchcomms.tracing", _EXPORTS, globals())
