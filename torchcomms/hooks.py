"""Hooks PyTorch's torchcomms integration imports (``torchcomms.hooks.FlightRecorderHook``).

Implemented in :mod:`torchcomms.tracing` (the flight recorder) and :mod:`torchcomms.guards`
(the NaN check); this module only re-exports them.
"""
from torchcomms.guards.nan_check import NanCheckHook
from torchcomms.tracing.fr_hook import FlightRecorderHook

__all__ = ["FlightRecorderHook", "NanCheckHook"]
