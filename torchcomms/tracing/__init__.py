"""Tracing for torchcomms.

The in-process recorders (flight recorder, structured logs, OpenTelemetry spans, the debug
handlers) observe communicators only through the dispatch path's hooks; the core never imports
them beyond :func:`attach_default_tracing`. The offline viewer behind ``torchcomms-trace``
lives in :mod:`torchcomms.tracing.viewer`, which this package does not import.
"""
from __future__ import annotations

from torchcomms.tracing.attach import attach_default_tracing
from torchcomms.tracing.flight_recorder import FlightRecorder, process_recorder
from torchcomms.tracing.fr_format import FORMAT_VERSION
from torchcomms.tracing.fr_hook import FlightRecorderHook

__all__ = [
    "FORMAT_VERSION",
    "FlightRecorder",
    "FlightRecorderHook",
    "attach_default_tracing",
    "process_recorder",
]
