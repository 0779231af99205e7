"""The server's event history: numbered events, the oldest dropped past ``max_events`` or
``max_bytes``, and the lookup of "events after seq N" that long-polling subscribers (and late
ones) ask for."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from . import protocol as proto
from .events import Event

__all__ = ["EventLog", "MAX_EVENTS_PER_REPLY"]

#: events one ``events`` reply carries at most
MAX_EVENTS_PER_REPLY = 1000


class EventLog:
    """Numbered events, at most ``max_events`` of them and ``max_bytes`` of their packed
    records (the newest is always kept)."""

    def __init__(self, max_events: int, max_bytes: int) -> None:
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._events: deque[tuple[Event, int]] = deque()
        self._bytes = 0
        self._next_seq = 1

    @property
    def last_seq(self) -> int:
        """The sequence number of the last event published (0 before the first)."""
        return self._next_seq - 1

    def append(self, topic: str, payload: dict[str, Any], run_id: str) -> tuple[Event, bytes, list[Event]]:
        """Number and keep a new event (stamped with ``ts`` and ``run_id`` unless it has them);
        returns it, its packed record and the oldest events dropped to make room, if any."""
        payload = dict(payload)
        payload.setdefault("ts", time.time())
        payload.setdefault("run_id", run_id)
        event = Event(self._next_seq, topic, payload)
        self._next_seq += 1
        packed = proto.encode(event.to_wire())
        nbytes = len(packed)
        self._events.append((event, nbytes))
        self._bytes += nbytes
        dropped: list[Event] = []
        while len(self._events) > 1 and (len(self._events) > self._max_events
                                         or self._bytes > self._max_bytes):
            old, old_bytes = self._events.popleft()
            self._bytes -= old_bytes
            dropped.append(old)
        return event, packed, dropped

    def after(self, since: int, topics: list[str] | None) -> list[Event]:
        """Events after ``since`` (of ``topics``, or all), at most :data:`MAX_EVENTS_PER_REPLY`."""
        if not self._events or since >= self._events[-1][0].seq:
            return []
        first = self._events[0][0].seq
        start = max(0, since + 1 - first)
        found: list[Event] = []
        for index in range(start, len(self._events)):
            event = self._events[index][0]
            if topics is None or event.topic in topics:
                found.append(event)
                if len(found) >= MAX_EVENTS_PER_REPLY:
                    break
        return found
