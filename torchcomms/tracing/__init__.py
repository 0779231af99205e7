"""Tracing for torchcomms: flight recorder, structured logs, OpenTelemetry spans, and the
``torchcomms-trace`` viewer (analyze / export --perfetto / view).

It observes communicators only through the dispatch path's hooks; the core never imports it
beyond :func:`attach_default_tracing`.
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
