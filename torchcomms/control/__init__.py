"""The torchcomms control plane: a ZeroMQ store server, its client, an event bus, heartbeats.

Importing this package or any of its modules never imports torch; only
:mod:`torchcomms.control.store` (the torch ``Store`` wrapper) does. The client is
``client`` (its API) over ``connection`` (sockets, request/reply), ``subscription``,
``heartbeat`` and ``arguments``; the server is ``server`` (loop, lifecycle) over ``kvstore``,
``event_log``, ``membership`` and ``router``; the wire is ``protocol`` (framing) over ``schema``.
Names are re-exported lazily.
"""

from __future__ import annotations

from torchcomms._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "ControlClient": "torchcomms.control.client",
    "Subscription": "torchcomms.control.client",
    "StoreServer": "torchcomms.control.server",
    "ControlStore": "torchcomms.control.store",
    "Limits": "torchcomms.control.protocol",
    "derive_keys": "torchcomms.control.secrets",
    "new_secret": "torchcomms.control.secrets",
    "load_secret": "torchcomms.control.secrets",
    "write_secret_file": "torchcomms.control.secrets",
    "ControlError": "torchcomms.control.errors",
    "ControlTimeoutError": "torchcomms.control.errors",
    "ControlAuthError": "torchcomms.control.errors",
    "ControlProtocolError": "torchcomms.control.errors",
    "ControlUnavailableError": "torchcomms.control.errors",
    "ControlClosedError": "torchcomms.control.errors",
    "ControlCancelledError": "torchcomms.control.errors",
    "ControlHandshakeTimeoutError": "torchcomms.control.errors",
    "ControlNoReplyError": "torchcomms.control.errors",
    "ControlLimitError": "torchcomms.control.errors",
    "ControlValueError": "torchcomms.control.errors",
    "ControlArgumentError": "torchcomms.control.errors",
    "ControlArgumentTypeError": "torchcomms.control.errors",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports('torchcomms.control', _EXPORTS, globals())
