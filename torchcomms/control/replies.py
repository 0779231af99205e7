"""The client's checks of the server's replies: a reply is input too (an int where bytes
belong would otherwise become ``bytes(n)``, n zero bytes), so a malformed one is a
:class:`ControlProtocolError` naming the request, never a wrong value or a bare error."""

from __future__ import annotations

from typing import Any

from .errors import ControlProtocolError
from .events import Event, EventSchemaError

__all__ = ["expect_reply", "expect_values", "decode_events"]


def _fits(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _malformed(op: str, what: str) -> ControlProtocolError:
    return ControlProtocolError(f"malformed {op} reply from the control server: {what}")


def expect_reply(op: str, value: Any, kind: type, items: type | None = None) -> Any:
    """``value``, the server's answer to ``op``, if it is a ``kind`` (whose elements are
    ``items``), else :class:`ControlProtocolError`."""
    if not _fits(value, kind) or (items is not None and not all(_fits(v, items) for v in value)):
        of = f" of {items.__name__}" if items is not None else ""
        raise _malformed(op, f"expected {kind.__name__}{of}, got {type(value).__name__}")
    return value


def expect_values(op: str, value: Any, count: int) -> list[bytes]:
    """A list of ``count`` byte strings (one per key asked for)."""
    values = expect_reply(op, value, list, bytes)
    if len(values) != count:
        raise _malformed(op, f"{len(values)} values for {count} keys")
    return values


def decode_events(value: Any) -> list[tuple[int, str, dict[str, Any]]]:
    """An ``events`` reply as ``(seq, topic, payload)`` tuples."""
    out = []
    for item in expect_reply("events", value, list):
        try:
            event = Event.from_wire(item)
        except EventSchemaError as exc:
            raise _malformed("events", str(exc)) from None
        out.append((event.seq, event.topic, event.payload))
    return out
