"""Checks of the control plane's call arguments (the client's calls, the server's constructor): each raises a typed error naming what was
wrong before a request is built (:class:`ControlArgumentTypeError` for a wrong type,
:class:`ControlArgumentError` for a wrong value)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from . import protocol as proto
from .errors import ControlArgumentError, ControlArgumentTypeError
from .events import EventSchemaError, validate_topic
from .protocol import Limits, ProtocolViolation

__all__ = ["seconds", "check_address", "check_key", "check_key_list", "check_value",
           "check_prefix", "check_topics", "check_member", "check_server_args"]


def seconds(value: Any, name: str, *, allow_none: bool = True) -> float | None:
    """Normalise a timeout given as seconds or ``timedelta``."""
    if value is None:
        if allow_none:
            return None
        raise ControlArgumentTypeError(f"{name} must be a number of seconds, got None")
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ControlArgumentTypeError(
            f"{name} must be a number of seconds or a timedelta, got {type(value).__name__}")
    value = float(value)
    if math.isnan(value) or value < 0:
        raise ControlArgumentError(f"{name} must be >= 0 seconds, got {value}")
    return value


def check_address(addr: Any) -> str:
    """``addr`` if it reads ``tcp://host:port`` with a valid port."""
    if not isinstance(addr, str):
        raise ControlArgumentTypeError(f"addr must be a str like 'tcp://host:port', "
                                       f"got {type(addr).__name__}")
    if not addr.startswith("tcp://") or ":" not in addr[6:]:
        raise ControlArgumentError(f"addr must look like 'tcp://host:port', got {addr!r}")
    port = addr.rsplit(":", 1)[1]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ControlArgumentError(f"addr {addr!r} has no valid port")
    return addr


def check_key(key: Any, limits: Limits, name: str = "key") -> str:
    if not isinstance(key, str):
        raise ControlArgumentTypeError(f"{name} must be a str, got {type(key).__name__}")
    try:
        return proto.check_key(name, key, limits)
    except ProtocolViolation as exc:
        raise ControlArgumentError(exc.message) from None


def check_key_list(keys: Any, limits: Limits, name: str = "keys") -> list[str]:
    if isinstance(keys, str):
        return [check_key(keys, limits, name)]
    if not isinstance(keys, (list, tuple)):
        raise ControlArgumentTypeError(
            f"{name} must be a list of str, got {type(keys).__name__}")
    if len(keys) > limits.max_keys_per_request:
        raise ControlArgumentError(f"{name} has {len(keys)} keys; the limit is "
                                   f"{limits.max_keys_per_request}")
    return [check_key(k, limits, f"{name}[{i}]") for i, k in enumerate(keys)]


def check_value(value: Any, limits: Limits, name: str = "value") -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise ControlArgumentTypeError(
            f"{name} must be bytes, got {type(value).__name__}")
    raw = bytes(value)
    if len(raw) > limits.max_value_bytes:
        raise ControlArgumentError(f"{name} is {len(raw)} bytes; the value limit is "
                                   f"{limits.max_value_bytes} bytes")
    return raw


def check_prefix(prefix: Any, limits: Limits) -> str:
    if not isinstance(prefix, str):
        raise ControlArgumentTypeError(f"prefix must be a str, got {type(prefix).__name__}")
    try:
        return proto.check_key("prefix", prefix, limits, allow_empty=True)
    except ProtocolViolation as exc:
        raise ControlArgumentError(exc.message) from None


def check_topics(topics: Any) -> list[str] | None:
    """A list of valid topics, or ``None`` for all topics."""
    if topics is None:
        return None
    if isinstance(topics, str):
        topics = [topics]
    if not isinstance(topics, (list, tuple, set, frozenset)):
        raise ControlArgumentTypeError(
            f"topics must be a str, a list of str or None, got {type(topics).__name__}")
    out = []
    for topic in topics:
        if not isinstance(topic, str):
            raise ControlArgumentTypeError(f"topic must be a str, got {type(topic).__name__}")
        try:
            validate_topic(topic)
        except EventSchemaError as exc:
            raise ControlArgumentError(str(exc)) from None
        out.append(topic)
    if not out:
        raise ControlArgumentError("topics must not be empty (use None for all topics)")
    return out


def check_member(member: Any) -> str:
    """A heartbeat member's name (e.g. ``"rank/3"``)."""
    if not isinstance(member, str) or not member or len(member) > proto.MAX_NAME_CHARS:
        raise ControlArgumentError(f"member must be a non-empty str of at most "
                                   f"{proto.MAX_NAME_CHARS} characters, got {member!r}")
    if not member.isprintable():
        raise ControlArgumentError(f"member must not contain control characters, got {member!r}")
    return member


def check_server_args(host: Any, port: Any, heartbeat_limit: Any, max_pending: Any,
                      max_events: Any, rank_silence: Any, max_beat_rate: Any = 1.0,
                      handshake_s: Any = 1.0) -> None:
    """The checks of :class:`~torchcomms.control.server.StoreServer`'s arguments."""
    if not isinstance(host, str) or not host:
        raise ControlArgumentError(f"host must be a non-empty str, got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ControlArgumentError(f"port must be an int in [0, 65535], got {port!r}")
    if isinstance(heartbeat_limit, bool) or not isinstance(heartbeat_limit, (int, float)) \
            or not heartbeat_limit > 0:
        raise ControlArgumentError(
            f"heartbeat_limit must be a positive number of seconds, got {heartbeat_limit!r}")
    if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending <= 0:
        raise ControlArgumentError(f"max_pending must be a positive int, got {max_pending!r}")
    if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events <= 0:
        raise ControlArgumentError(f"max_events must be a positive int, got {max_events!r}")
    if isinstance(max_beat_rate, bool) or not isinstance(max_beat_rate, (int, float)) \
            or not max_beat_rate > 0 or max_beat_rate == float("inf"):
        raise ControlArgumentError(
            f"max_beat_rate must be a positive number of beats a second, got {max_beat_rate!r}")
    if isinstance(handshake_s, bool) or not isinstance(handshake_s, (int, float)) \
            or not 0 < handshake_s <= 3600:
        raise ControlArgumentError(
            f"handshake_s must be a number of seconds in (0, 3600], got {handshake_s!r}")
    if rank_silence not in ("failed", "suspect"):
        raise ControlArgumentError(
            f"rank_silence must be 'failed' or 'suspect', got {rank_silence!r}")
