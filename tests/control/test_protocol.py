"""Unit tests of request validation (each rejection names what was wrong)."""

from __future__ import annotations

import msgpack
import pytest

from torchcomms.control.protocol import Limits, ProtocolViolation, decode_request, encode

LIMITS = Limits(max_key_bytes=32, max_value_bytes=64, max_keys_per_request=4,
                message_overhead_bytes=1024)


def bad(message: object, code: str, match: str) -> None:
    frame = message if isinstance(message, bytes) else encode(message)  # type: ignore[arg-type]
    with pytest.raises(ProtocolViolation, match=match) as info:
        decode_request(frame, LIMITS)
    assert info.value.code == code


def test_valid_request_round_trips() -> None:
    req = decode_request(encode({"id": 7, "op": "set", "key": "k", "value": b"v"}), LIMITS)
    assert (req.id, req.op, req.args) == (7, "set", {"key": "k", "value": b"v"})


@pytest.mark.parametrize("message,code,match", [
    (b"", "protocol", "empty message"),
    (b"\xc1", "protocol", "not a valid msgpack"),
    (encode({"id": 1, "op": "set", "key": "k", "value": b"v"})[:-2], "protocol",
     "not a valid msgpack"),
    (encode([1, 2]), "protocol", "must be a map"),
    ({"op": "ping"}, "protocol", "'id'"),
    ({"id": -1, "op": "ping"}, "protocol", "'id'"),
    ({"id": True, "op": "ping"}, "protocol", "'id'"),
    ({"id": 1, "op": 5}, "protocol", "'op' must be a str"),
    ({"id": 1, "op": "explode"}, "protocol", "unknown op"),
    ({"id": 1, "op": "set", "key": "k"}, "protocol", "missing field 'value'"),
    ({"id": 1, "op": "set", "key": "k", "value": "text"}, "protocol", "must be bytes"),
    ({"id": 1, "op": "set", "key": 3, "value": b""}, "protocol", "must be a str"),
    ({"id": 1, "op": "set", "key": "", "value": b""}, "protocol", "must not be empty"),
    ({"id": 1, "op": "set", "key": "k" * 33, "value": b""}, "limit", "key limit"),
    ({"id": 1, "op": "set", "key": "k", "value": b"x" * 65}, "limit", "value limit"),
    ({"id": 1, "op": "set", "key": "k", "value": b"", "extra": 1}, "protocol", "unknown field"),
    ({"id": 1, "op": "add", "key": "k", "delta": 1.5}, "protocol", "must be an int"),
    ({"id": 1, "op": "add", "key": "k", "delta": 2**63}, "protocol", "int64"),
    ({"id": 1, "op": "get", "key": "k", "timeout": -1}, "protocol", ">= 0"),
    ({"id": 1, "op": "get", "key": "k", "timeout": "soon"}, "protocol", "seconds"),
    ({"id": 1, "op": "wait", "keys": "k"}, "protocol", "list of str"),
    ({"id": 1, "op": "wait", "keys": ["a"] * 5}, "limit", "the limit is 4"),
    ({"id": 1, "op": "multi_set", "keys": ["a", "b"], "values": [b""]}, "protocol",
     "2 keys but 1 values"),
    ({"id": 1, "op": "publish", "topic": "t", "payload": []}, "protocol", "must be a map"),
    ({"id": 1, "op": "heartbeat", "member": ""}, "protocol", "1..256"),
    ({"id": 1, "op": "heartbeat", "member": "rank/1\x9b2J"}, "protocol", "control characters"),
    ({"id": 1, "op": "heartbeat_stop", "member": "rank/\u202e1"}, "protocol", "control characters"),
    ({"id": 1, "op": "heartbeat", "member": "rank/1\x7f"}, "protocol", "control characters"),
    ({"id": 1, "op": "events", "since": -3}, "protocol", ">= 0"),
])
def test_rejections(message: object, code: str, match: str) -> None:
    bad(message, code, match)


def test_oversized_message_rejected_before_parsing() -> None:
    frame = b"\x00" * (LIMITS.max_message_bytes + 1)
    bad(frame, "limit", "the limit is")


def test_extension_types_are_refused() -> None:
    frame = msgpack.packb({"id": 1, "op": "publish", "topic": "t",
                           "payload": {"x": msgpack.ExtType(5, b"abc")}})
    bad(frame, "protocol", "not a valid msgpack")


def test_invalid_utf8_refused() -> None:
    frame = b"\x82\xa2id\x01\xa2op\xa4\xff\xfe\xfd\xfc"
    bad(frame, "protocol", "not a valid msgpack")


def test_request_id_kept_on_field_errors() -> None:
    with pytest.raises(ProtocolViolation) as info:
        decode_request(encode({"id": 42, "op": "set", "key": 1, "value": b""}), LIMITS)
    assert info.value.request_id == 42


def test_limits_validate_themselves() -> None:
    with pytest.raises(ValueError, match="max_key_bytes"):
        Limits(max_key_bytes=0)
