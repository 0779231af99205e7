"""torchcomms-run: a multi-node launcher that hosts the control plane and supervises workers.

This package never imports torch (the agent must start fast); it talks to the job's
control plane through :mod:`torchcomms.control` only.
"""

from __future__ import annotations

from .errors import record
from .exceptions import (
    AuthenticationError,
    ControlPlaneLostError,
    LauncherError,
    RendezvousClosedError,
    RendezvousError,
    RendezvousTimeoutError,
    UsageError,
)

__all__ = [
    "record",
    "LauncherError",
    "UsageError",
    "RendezvousError",
    "RendezvousTimeoutError",
    "RendezvousClosedError",
    "AuthenticationError",
    "ControlPlaneLostError",
]
