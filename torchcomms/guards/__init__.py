"""Guards: hooks that refuse an op before it leaves the process (they raise; they do not
record). Registered on a communicator like any other pre-hook."""
from __future__ import annotations

from torchcomms.guards.nan_check import NanCheckHook

__all__ = ["NanCheckHook"]
