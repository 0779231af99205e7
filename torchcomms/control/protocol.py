"""Wire protocol of the control plane: msgpack framing of requests and replies.

A request is one ZeroMQ frame holding a msgpack map ``{"id": int, "op": str, <fields>}``;
its reply is one frame ``{"id": int | None, "ok": True, "value": ...}`` or
``{"id": ..., "ok": False, "error": {"code": str, "message": str, "keys": [...]}}``.
Nothing but msgpack's plain types ever crosses the wire (no pickle, no extension types), and
every request is validated against :data:`SCHEMA` (defined, with the size limits, in
:mod:`torchcomms.control.schema`) before the server acts on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .errors import (
    ControlError,
    ControlLimitError,
    ControlProtocolError,
    ControlTimeoutError,
    ControlUnavailableError,
    ControlValueError,
)
from .schema import (
    INT64_MAX,
    INT64_MIN,
    MAX_NAME_CHARS,
    MAX_PAYLOAD_DEPTH,
    MAX_REQUEST_ID,
    MAX_TIMEOUT_S,
    PROTOCOL_VERSION,
    SCHEMA,
    Checker,
    Limits,
    ProtocolViolation,
    Request,
    check_key,
    check_payload,
)

__all__ = [
    "PROTOCOL_VERSION",
    "Limits",
    "Request",
    "ProtocolViolation",
    "SCHEMA",
    "ERROR_CODES",
    "encode",
    "decode_request",
    "encode_ok",
    "encode_error",
    "decode_reply",
    "error_from_reply",
    "check_key",
    "check_payload",
    "INT64_MIN",
    "INT64_MAX",
    "MAX_REQUEST_ID",
    "MAX_TIMEOUT_S",
    "MAX_PAYLOAD_DEPTH",
    "MAX_NAME_CHARS",
    "Checker",
]

# Error codes carried in error replies, and the client-side exception of each.
ERROR_CODES: dict[str, type[ControlError]] = {
    "protocol": ControlProtocolError,
    "limit": ControlLimitError,
    "timeout": ControlTimeoutError,
    "value": ControlValueError,
    "unavailable": ControlUnavailableError,
    "internal": ControlError,
}



# --------------------------------------------------------------------------- codec

def encode(message: Mapping[str, Any]) -> bytes:
    """Pack a message (plain msgpack types only)."""
    return msgpack.packb(message, use_bin_type=True)


def _unpack(frame: bytes, limits: Limits) -> Any:
    return msgpack.unpackb(
        frame,
        raw=False,
        use_list=True,
        strict_map_key=True,
        max_bin_len=limits.max_message_bytes,
        max_str_len=limits.max_message_bytes,
        max_array_len=max(limits.max_keys_per_request, 1 << 16),
        max_map_len=1 << 16,
        max_ext_len=0,
        unicode_errors="strict",
    )


def decode_request(frame: bytes, limits: Limits) -> Request:
    """Decode and validate one request frame; raise :class:`ProtocolViolation` if bad."""
    if len(frame) > limits.max_message_bytes:
        raise ProtocolViolation("limit", f"message is {len(frame)} bytes; the limit is "
                                         f"{limits.max_message_bytes} bytes")
    if not frame:
        raise ProtocolViolation("protocol", "empty message")
    try:
        message = _unpack(frame, limits)
    except msgpack.ExtraData:
        raise ProtocolViolation("protocol", "trailing bytes after the msgpack message") from None
    except (ValueError, msgpack.UnpackException, TypeError, RecursionError) as exc:
        # ValueError covers truncated input, invalid UTF-8, ext types and size limits.
        raise ProtocolViolation("protocol", f"not a valid msgpack message: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolViolation("protocol", f"message must be a map, got {type(message).__name__}")
    request_id = message.get("id")
    if not isinstance(request_id, int) or isinstance(request_id, bool) \
            or not 0 <= request_id <= MAX_REQUEST_ID:
        raise ProtocolViolation("protocol", "field 'id' must be an int in [0, 2**63)")
    op = message.get("op")
    if not isinstance(op, str):
        raise ProtocolViolation("protocol", f"field 'op' must be a str, got {type(op).__name__}",
                                request_id)
    fields = SCHEMA.get(op)
    if fields is None:
        raise ProtocolViolation("protocol", f"unknown op {op[:64]!r}", request_id)
    args: dict[str, Any] = {}
    for name, value in message.items():
        if name in ("id", "op"):
            continue
        spec = fields.get(name)
        if spec is None:
            raise ProtocolViolation("protocol", f"unknown field {name[:64]!r} for op {op!r}",
                                    request_id)
        try:
            args[name] = spec[0](name, value, limits)
        except ProtocolViolation as exc:
            exc.request_id = request_id
            exc.message = f"op {op!r}: {exc.message}"
            raise
    for name, (_, required) in fields.items():
        if required and name not in args:
            raise ProtocolViolation("protocol", f"op {op!r}: missing field {name!r}", request_id)
    if op == "multi_set" and len(args["keys"]) != len(args["values"]):
        raise ProtocolViolation("protocol", f"op 'multi_set': {len(args['keys'])} keys but "
                                            f"{len(args['values'])} values", request_id)
    return Request(request_id, op, args)


def encode_ok(request_id: int | None, value: Any = None) -> bytes:
    return encode({"id": request_id, "ok": True, "value": value})


#: the bytes of ``{"id": ..., "ok": True, "value": ...}`` around the id and the value
_OK_HEAD = b"\x83" + encode("id")
_OK_MIDDLE = encode("ok") + encode(True) + encode("value")


def encode_ok_packed(request_id: int | None, packed_value: bytes) -> bytes:
    """``encode_ok(request_id, value)`` for a value packed once (``encode(value)``) and sent to
    many requests: the same bytes, without packing the value again for each."""
    return b"".join((_OK_HEAD, encode(request_id), _OK_MIDDLE, packed_value))


def encode_error(request_id: int | None, code: str, message: str,
                 keys: list[str] | None = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if keys:
        error["keys"] = keys
    return encode({"id": request_id, "ok": False, "error": error})


@dataclass
class Reply:
    id: int | None
    ok: bool
    value: Any = None
    code: str = ""
    message: str = ""
    keys: list[str] = field(default_factory=list)


def decode_reply(frame: bytes, limits: Limits) -> Reply:
    """Decode one reply frame; raise :class:`ControlProtocolError` if it is malformed."""
    try:
        message = msgpack.unpackb(frame, raw=False, strict_map_key=True, max_ext_len=0)
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a protocol error
        raise ControlProtocolError(f"malformed reply from the control server: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("ok"), bool):
        raise ControlProtocolError("malformed reply from the control server (no 'ok' field)")
    request_id = message.get("id")
    if request_id is not None and (not isinstance(request_id, int) or isinstance(request_id, bool)):
        raise ControlProtocolError("malformed reply from the control server (bad 'id')")
    if message["ok"]:
        return Reply(request_id, True, message.get("value"))
    error = message.get("error")
    if not isinstance(error, dict):
        raise ControlProtocolError("malformed error reply from the control server")
    code = error.get("code") if isinstance(error.get("code"), str) else "internal"
    text = error.get("message") if isinstance(error.get("message"), str) else "(no message)"
    keys = error.get("keys") if isinstance(error.get("keys"), list) else []
    return Reply(request_id, False, None, code, text, [k for k in keys if isinstance(k, str)])


def error_from_reply(reply: Reply, context: str) -> ControlError:
    """Build the typed exception for an error reply."""
    cls = ERROR_CODES.get(reply.code, ControlError)
    message = f"{context}: {reply.message}"
    if cls is ControlTimeoutError:
        return ControlTimeoutError(message, reply.keys)
    return cls(message)
