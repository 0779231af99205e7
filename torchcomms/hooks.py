"""Hooks PyTorch's torchcomms integration imports (``torchcomms.hooks.FlightRecorderHook``).

Implemented in :mod:`torchcomms.tracing`; this module only re-exports them.
"""
from torchcomms.tracing.fr_hook import FlightRecorderHook
from torchcomms.tracing.nan_check import NanCheckHook

__all__ = ["FlightRecorderHook", "NanCheckHook"]
