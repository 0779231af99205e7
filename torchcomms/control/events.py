"""Event bus vocabulary: topics, their payload schema, and event records.

Every event has a topic, a payload map and a sequence number assigned by the server (1, 2,
...). The server stamps ``ts`` (epoch seconds) and ``run_id`` into the payload when the
publisher did not, and keeps the event under ``events/<seq:08d>`` so that a late subscriber
can replay it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Event",
    "RANK_FAILED",
    "NODE_LOST",
    "MEMBERSHIP",
    "JOB_STOPPING",
    "MEMBER_LOST",
    "RANK_SILENT",
    "RANK_HEARD",
    "KNOWN_TOPICS",
    "EVENT_KEY_PREFIX",
    "event_key",
    "validate_event",
    "validate_topic",
    "EventSchemaError",
]

RANK_FAILED = "rank_failed"
NODE_LOST = "node_lost"
MEMBERSHIP = "membership"
JOB_STOPPING = "job_stopping"
MEMBER_LOST = "member_lost"
#: a supervised rank's heartbeats went silent (a suspicion: its supervisor decides)
RANK_SILENT = "rank_silent"
#: a rank reported ``rank_silent`` beats again
RANK_HEARD = "rank_heard"

EVENT_KEY_PREFIX = "events/"

_TOPIC_RE = re.compile(r"^[A-Za-z0-9_.\-/]{1,128}$")

# topic -> {field: (accepted types, required)}
KNOWN_TOPICS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    RANK_FAILED: {
        "rank": ((int,), True),
        "reason": ((str,), True),
        "exit_code": ((int, type(None)), False),
        "signal": ((int, str, type(None)), False),
        "host": ((str,), False),
    },
    NODE_LOST: {
        "node_rank": ((int,), True),
        "ranks": ((list,), True),
        "host": ((str,), False),
        "reason": ((str,), True),
    },
    MEMBERSHIP: {
        "comm": ((str,), True),
        "epoch": ((int,), True),
        "ranks": ((list,), True),
    },
    JOB_STOPPING: {"reason": ((str,), True)},
    MEMBER_LOST: {"member": ((str,), True), "reason": ((str,), True)},
    RANK_SILENT: {"rank": ((int,), True), "member": ((str,), True), "silent_s": ((int, float), True),
                  "host": ((str,), False), "pid": ((int,), False)},
    RANK_HEARD: {"rank": ((int,), True), "member": ((str,), True), "silent_s": ((int, float), True),
                 "host": ((str,), False), "pid": ((int,), False)},
}


class EventSchemaError(ValueError):
    """An event's topic or payload does not fit the schema."""


@dataclass(frozen=True)
class Event:
    """One event as delivered to subscribers."""

    seq: int
    topic: str
    payload: dict[str, Any]

    def to_wire(self) -> list[Any]:
        return [self.seq, self.topic, self.payload]

    @classmethod
    def from_wire(cls, item: Any) -> Event:
        if (not isinstance(item, list) or len(item) != 3 or not isinstance(item[0], int)
                or not isinstance(item[1], str) or not isinstance(item[2], dict)):
            raise EventSchemaError("malformed event record")
        return cls(item[0], item[1], item[2])


def event_key(seq: int) -> str:
    """The store key an event is kept under."""
    return f"{EVENT_KEY_PREFIX}{seq:08d}"


def validate_topic(topic: str) -> None:
    """Check a topic name: 1-128 characters of letters, digits and ``_ . - /``."""
    if not isinstance(topic, str) or not _TOPIC_RE.match(topic):
        raise EventSchemaError(
            f"topic {topic!r} must be 1-128 characters of letters, digits and _ . - /"
        )


def validate_event(topic: str, payload: dict[str, Any]) -> None:
    """Check a topic name and, for the topics the project defines, the payload's fields."""
    validate_topic(topic)
    if not isinstance(payload, dict):
        raise EventSchemaError(f"payload of {topic!r} must be a dict, got {type(payload).__name__}")
    for key in payload:
        if not isinstance(key, str):
            raise EventSchemaError(f"payload of {topic!r} has a non-str key {key!r}")
    spec = KNOWN_TOPICS.get(topic)
    if spec is None:
        return
    for name, (types, required) in spec.items():
        if name not in payload:
            if required:
                raise EventSchemaError(f"payload of {topic!r} lacks the field {name!r}")
            continue
        value = payload[name]
        if isinstance(value, bool) and bool not in types:
            raise EventSchemaError(f"field {name!r} of {topic!r} must not be a bool")
        if not isinstance(value, types):
            expected = " or ".join(t.__name__ for t in types)
            raise EventSchemaError(
                f"field {name!r} of {topic!r} must be {expected}, got {type(value).__name__}"
            )
    if "ts" in payload and (isinstance(payload["ts"], bool)
                            or not isinstance(payload["ts"], (int, float))):
        raise EventSchemaError(f"field 'ts' of {topic!r} must be a number")
    if "run_id" in payload and not isinstance(payload["run_id"], str):
        raise EventSchemaError(f"field 'run_id' of {topic!r} must be a str")
