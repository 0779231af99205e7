"""Typed errors of the control plane.

Every error is a :class:`ControlError`, itself a ``RuntimeError`` so that code written for
torch's stores (which raise ``RuntimeError``/``DistStoreError``) still catches it.
"""

from __future__ import annotations

__all__ = [
    "ControlError",
    "ControlTimeoutError",
    "ControlAuthError",
    "ControlProtocolError",
    "ControlUnavailableError",
    "ControlArgumentError",
    "ControlArgumentTypeError",
    "ControlValueError",
    "ControlLimitError",
    "ControlClosedError",
    "ControlCancelledError",
    "ControlHandshakeTimeoutError",
    "ControlNoReplyError",
]


class ControlError(RuntimeError):
    """Base class of every control-plane error."""


class ControlTimeoutError(ControlError):
    """A wait (``get``, ``wait``, ...) did not complete before its deadline.

    ``keys`` names the keys that were still missing when the deadline passed (may be empty).
    """

    def __init__(self, message: str, keys: list[str] | None = None) -> None:
        super().__init__(message)
        self.keys: list[str] = list(keys or [])


class ControlAuthError(ControlError):
    """The server refused this client's credentials (wrong or missing job secret)."""


class ControlProtocolError(ControlError):
    """A message broke the wire protocol (malformed, wrong type, unknown op, ...)."""


class ControlLimitError(ControlProtocolError):
    """A key, value or message exceeded a configured size limit."""


class ControlValueError(ControlError, ValueError):
    """The server rejected a well-formed request (e.g. ``add`` on a non-integer value)."""


class ControlUnavailableError(ControlError):
    """The control server could not be reached or went away during a request."""


class ControlClosedError(ControlUnavailableError):
    """The client (or server) was closed; no further requests are possible."""


class ControlCancelledError(ControlUnavailableError):
    """The calling thread's calls were cancelled (``ControlClient.cancel_calls_of``): its
    caller gave up on it."""


class ControlNoReplyError(ControlUnavailableError):
    """The connection stood, but the server did not answer within the request's budget: it is
    stopped, hung, or starved of CPU on a busy host. A caller whose own deadline is later may
    ask again (the connection is not known to be lost)."""


class ControlHandshakeTimeoutError(ControlUnavailableError):
    """A TCP connection was made, but the peer never answered the CURVE handshake in time: the
    server is stopped or hung (the kernel still accepts connections for it), or the peer is
    not a torchcomms control server. Not a refused secret: a refusal comes within a round trip
    as :class:`ControlAuthError`."""


class ControlArgumentError(ControlError, ValueError):
    """A call was made with an invalid argument value (checked before anything is sent)."""


class ControlArgumentTypeError(ControlError, TypeError):
    """A call was made with an argument of the wrong type (checked before anything is sent)."""
