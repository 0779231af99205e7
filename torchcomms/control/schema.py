"""Schema of the control plane's requests: the size limits, the checks of every field, and
:data:`SCHEMA`, the fields each op takes. Nothing but msgpack's plain types passes
:func:`check_payload`; :mod:`torchcomms.control.protocol` applies the schema to each decoded
request before the server acts on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

__all__ = [
    "PROTOCOL_VERSION",
    "Limits",
    "Request",
    "ProtocolViolation",
    "SCHEMA",
    "Checker",
    "check_key",
    "check_payload",
    "INT64_MIN",
    "INT64_MAX",
    "MAX_REQUEST_ID",
    "MAX_TIMEOUT_S",
    "MAX_PAYLOAD_DEPTH",
    "MAX_NAME_CHARS",
]

PROTOCOL_VERSION = 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_REQUEST_ID = 2**63 - 1
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_PAYLOAD_DEPTH = 16
MAX_NAME_CHARS = 256


@dataclass(frozen=True)
class Limits:
    """Size limits enforced on both sides of the wire (``max_store_bytes``,
    ``max_event_log_bytes``, ``max_pending_bytes`` and ``max_member_bytes``: by the server).

    ``max_message_bytes`` bounds one request frame (checked explicitly, answered with a
    ``limit`` error); frames beyond ``hard_message_bytes`` are cut off by ZeroMQ itself
    (``MAXMSGSIZE``: the sender is disconnected without a reply).
    """

    max_key_bytes: int = 4096
    max_value_bytes: int = 64 * 1024 * 1024
    max_keys_per_request: int = 100_000
    max_payload_bytes: int = 1024 * 1024
    message_overhead_bytes: int = 1024 * 1024
    #: keys and values (queued items included) the server holds at most, all together
    max_store_bytes: int = 4 * 1024**3
    #: packed event records the server keeps for late subscribers (the oldest go first)
    max_event_log_bytes: int = 256 * 1024**2
    #: memory of the parked (blocked) requests, all together, estimated from the keys they wait
    #: for (``kvstore.OBJECT_BYTES``): a rendezvous of 4,096 ranks, each waiting for every
    #: rank's address, parks about 1.6 GiB
    max_pending_bytes: int = 4 * 1024**3
    #: heartbeat members (names, infos packed, ``membership.MEMBER_BYTES`` each), all together
    max_member_bytes: int = 256 * 1024**2

    def __post_init__(self) -> None:
        for name in ("max_key_bytes", "max_value_bytes", "max_keys_per_request",
                     "max_payload_bytes", "message_overhead_bytes", "max_store_bytes",
                     "max_event_log_bytes", "max_pending_bytes", "max_member_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")

    @property
    def max_message_bytes(self) -> int:
        return self.max_value_bytes + self.message_overhead_bytes

    @property
    def hard_message_bytes(self) -> int:
        return 2 * self.max_message_bytes


class ProtocolViolation(Exception):
    """Raised while decoding/validating a request; becomes an error reply."""

    def __init__(self, code: str, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass
class Request:
    """A validated request."""

    id: int
    op: str
    args: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- field checks

Checker = Callable[[str, Any, Limits], Any]


def _fail(code: str, message: str) -> ProtocolViolation:
    return ProtocolViolation(code, message)


def _type_name(value: Any) -> str:
    return type(value).__name__


def check_key(name: str, value: Any, limits: Limits, *, allow_empty: bool = False) -> str:
    """Validate one store key (a non-empty str of at most ``max_key_bytes`` UTF-8 bytes)."""
    if not isinstance(value, str):
        raise _fail("protocol", f"field {name!r} must be a str, got {_type_name(value)}")
    if not value and not allow_empty:
        raise _fail("protocol", f"field {name!r} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise _fail("protocol", f"field {name!r} is not valid Unicode (lone surrogate)") from None
    if size > limits.max_key_bytes:
        raise _fail("limit", f"field {name!r} is {size} bytes; the key limit is "
                             f"{limits.max_key_bytes} bytes")
    return value


def _key(name: str, value: Any, limits: Limits) -> str:
    return check_key(name, value, limits)


def _prefix(name: str, value: Any, limits: Limits) -> str:
    return check_key(name, value, limits, allow_empty=True)


def _keys(name: str, value: Any, limits: Limits) -> list[str]:
    if not isinstance(value, list):
        raise _fail("protocol", f"field {name!r} must be a list of str, got {_type_name(value)}")
    if len(value) > limits.max_keys_per_request:
        raise _fail("limit", f"field {name!r} has {len(value)} keys; the limit is "
                             f"{limits.max_keys_per_request}")
    if _plain_keys(value, limits):
        return value
    return [check_key(f"{name}[{i}]", item, limits) for i, item in enumerate(value)]


def _plain_keys(keys: list[Any], limits: Limits) -> bool:
    """Whether every key is a non-empty str that surely fits (at most 4 UTF-8 bytes a
    character) and encodes: the check of a whole list at C speed (a rendezvous reads
    thousands of keys at once); a list this cannot vouch for is checked key by key."""
    if not keys or set(map(type, keys)) != {str} or "" in keys:
        return False
    if max(map(len, keys)) * 4 > limits.max_key_bytes:
        return False
    try:
        "".join(keys).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _value(name: str, value: Any, limits: Limits) -> bytes:
    if not isinstance(value, bytes):
        raise _fail("protocol", f"field {name!r} must be bytes, got {_type_name(value)}")
    if len(value) > limits.max_value_bytes:
        raise _fail("limit", f"field {name!r} is {len(value)} bytes; the value limit is "
                             f"{limits.max_value_bytes} bytes")
    return value


def _values(name: str, value: Any, limits: Limits) -> list[bytes]:
    if not isinstance(value, list):
        raise _fail("protocol", f"field {name!r} must be a list of bytes, got {_type_name(value)}")
    if len(value) > limits.max_keys_per_request:
        raise _fail("limit", f"field {name!r} has {len(value)} values; the limit is "
                             f"{limits.max_keys_per_request}")
    return [_value(f"{name}[{i}]", item, limits) for i, item in enumerate(value)]


def _int64(name: str, value: Any, limits: Limits) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail("protocol", f"field {name!r} must be an int, got {_type_name(value)}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise _fail("protocol", f"field {name!r} is outside the int64 range")
    return value


def _seq(name: str, value: Any, limits: Limits) -> int:
    value = _int64(name, value, limits)
    if value < 0:
        raise _fail("protocol", f"field {name!r} must be >= 0, got {value}")
    return value


def _timeout(name: str, value: Any, limits: Limits) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail("protocol", f"field {name!r} must be a number of seconds or nil, "
                                f"got {_type_name(value)}")
    value = float(value)
    if math.isnan(value) or value < 0:
        raise _fail("protocol", f"field {name!r} must be >= 0 seconds, got {value}")
    return min(value, MAX_TIMEOUT_S)


def _name(name: str, value: Any, limits: Limits) -> str:
    if not isinstance(value, str):
        raise _fail("protocol", f"field {name!r} must be a str, got {_type_name(value)}")
    if not value or len(value) > MAX_NAME_CHARS:
        raise _fail("protocol", f"field {name!r} must have 1..{MAX_NAME_CHARS} characters")
    if not value.isprintable():
        raise _fail("protocol", f"field {name!r} must not contain control characters")
    return value


def _names(name: str, value: Any, limits: Limits) -> list[str]:
    if not isinstance(value, list):
        raise _fail("protocol", f"field {name!r} must be a list of str, got {_type_name(value)}")
    if len(value) > 1024:
        raise _fail("limit", f"field {name!r} has {len(value)} entries; the limit is 1024")
    return [_name(f"{name}[{i}]", item, limits) for i, item in enumerate(value)]


def _optional_names(name: str, value: Any, limits: Limits) -> list[str] | None:
    return None if value is None else _names(name, value, limits)


def _payload(name: str, value: Any, limits: Limits) -> dict[str, Any]:
    return check_payload(value, limits, name=name)


def _optional_payload(name: str, value: Any, limits: Limits) -> dict[str, Any] | None:
    return None if value is None else check_payload(value, limits, name=name)


def _bool(name: str, value: Any, limits: Limits) -> bool:
    if not isinstance(value, bool):
        raise _fail("protocol", f"field {name!r} must be a bool, got {_type_name(value)}")
    return value


def check_payload(value: Any, limits: Limits, *, name: str = "payload") -> dict[str, Any]:
    """Validate an event/info payload: a map of str keys to JSON-like values."""
    if not isinstance(value, dict):
        raise _fail("protocol", f"field {name!r} must be a map, got {_type_name(value)}")
    _check_plain(value, name, 0)
    try:
        size = len(msgpack.packb(value, use_bin_type=True))  # its size on the wire
    except (ValueError, TypeError, OverflowError) as exc:
        raise _fail("protocol", f"field {name!r} cannot be encoded: {exc}") from None
    if size > limits.max_payload_bytes:
        raise _fail("limit", f"field {name!r} is {size} bytes; the payload limit is "
                             f"{limits.max_payload_bytes} bytes")
    return value


def _check_plain(value: Any, where: str, depth: int) -> None:
    if depth > MAX_PAYLOAD_DEPTH:
        raise _fail("protocol", f"{where} nests deeper than {MAX_PAYLOAD_DEPTH} levels")
    if value is None or isinstance(value, (bool, bytes)):
        return
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _fail("protocol", f"{where} is not valid Unicode (lone surrogate)") from None
        return
    if isinstance(value, int):
        if not INT64_MIN <= value <= 2**64 - 1:
            raise _fail("protocol", f"{where} holds an integer outside 64 bits")
        return
    if isinstance(value, float):
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise _fail("protocol", f"{where} has a non-str key of type {_type_name(key)}")
            _check_plain(item, f"{where}.{key}", depth + 1)
        return
    raise _fail("protocol", f"{where} holds an unsupported type {_type_name(value)}")


# --------------------------------------------------------------------------- schema

# op -> {field: (checker, required)}
SCHEMA: dict[str, dict[str, tuple[Checker, bool]]] = {
    "hello": {},
    "ping": {},
    "set": {"key": (_key, True), "value": (_value, True)},
    "get": {"key": (_key, True), "timeout": (_timeout, False)},
    "add": {"key": (_key, True), "delta": (_int64, True)},
    "compare_set": {"key": (_key, True), "expected": (_value, True), "desired": (_value, True)},
    "delete": {"key": (_key, True)},
    "delete_prefix": {"prefix": (_prefix, True)},
    "check": {"keys": (_keys, True)},
    "wait": {"keys": (_keys, True), "timeout": (_timeout, False)},
    "keys": {"prefix": (_prefix, True)},
    "num_keys": {},
    "append": {"key": (_key, True), "value": (_value, True)},
    "multi_get": {"keys": (_keys, True), "timeout": (_timeout, False)},
    "multi_set": {"keys": (_keys, True), "values": (_values, True)},
    "publish": {"topic": (_name, True), "payload": (_payload, True)},
    "events": {"since": (_seq, True), "topics": (_optional_names, False),
               "timeout": (_timeout, False)},
    "heartbeat": {"member": (_name, True), "limit": (_timeout, False),
                  "interval": (_timeout, False), "info": (_optional_payload, False)},
    "heartbeat_stop": {"member": (_name, True)},
    "queue_push": {"key": (_key, True), "value": (_value, True)},
    "queue_pop": {"key": (_key, True), "block": (_bool, False), "timeout": (_timeout, False)},
    "queue_len": {"key": (_key, True)},
}


