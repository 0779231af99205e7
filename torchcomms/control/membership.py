"""Heartbeat tracking on the server: which members (``rank/3``, ``node/1``, ...) beat, and
the events their silence (or return) turns into. State only; the server publishes the events
this returns."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import msgpack

from .events import MEMBER_LOST, NODE_LOST, RANK_FAILED, RANK_HEARD, RANK_SILENT
from .protocol import ProtocolViolation

__all__ = ["Members", "Member", "HEARTBEAT_CHECK_S"]

#: how often silent members are looked for
HEARTBEAT_CHECK_S = 0.05
#: what a member holds besides its name and its packed info: counted toward ``max_bytes``
MEMBER_BYTES = 256
_log = logging.getLogger("torchcomms.control.server")

EventSpec = tuple[str, dict[str, Any]]


@dataclass
class Member:
    limit: float
    last_seen: float
    info: dict[str, Any]
    silent: bool = False  # reported ``rank_silent`` and not heard since
    size: int = 0  # counted toward ``Members.held_bytes``


def _rank_of(name: str) -> int | None:
    kind, _, index = name.partition("/")
    return int(index) if kind == "rank" and index.isdigit() else None


def _rank_fields(name: str, member: Member) -> dict[str, Any]:
    fields: dict[str, Any] = {"rank": _rank_of(name), "member": name, "reason": "heartbeat"}
    for key, kind in (("host", str), ("pid", int)):
        value = member.info.get(key)
        if isinstance(value, kind) and not isinstance(value, bool):
            fields[key] = value
    return fields


def _lost_event(name: str, member: Member, silent: float) -> EventSpec:
    kind, _, index = name.partition("/")
    host = member.info.get("host")
    common: dict[str, Any] = {"reason": "heartbeat", "member": name,
                              "silent_s": round(silent, 3)}
    if isinstance(host, str):
        common["host"] = host
    if kind == "rank" and index.isdigit():
        return RANK_FAILED, {"rank": int(index), **common}
    if kind == "node" and index.isdigit():
        ranks = member.info.get("ranks")
        ranks = ranks if isinstance(ranks, list) else []
        return NODE_LOST, {"node_rank": int(index), "ranks": ranks, **common}
    return MEMBER_LOST, common


class Members:
    """The members that send heartbeats. ``rank_silence`` is ``"failed"`` (a silent rank is
    lost) or ``"suspect"`` (``rank_silent``, then ``rank_heard`` if it beats again)."""

    def __init__(self, rank_silence: str) -> None:
        self.rank_silence = rank_silence
        self._members: dict[str, Member] = {}
        #: the members' names and infos (packed) and ``MEMBER_BYTES`` each
        self.held_bytes = 0
        #: when :meth:`check` next looks for silent members (monotonic seconds)
        self.next_check = 0.0

    def __bool__(self) -> bool:
        return bool(self._members)

    def beat(self, name: str, limit: float, info: dict[str, Any], now: float,
             max_bytes: int) -> EventSpec | None:
        """Record a heartbeat; returns the ``rank_heard`` event of a member that was silent.
        A new member that would make the members hold more than ``max_bytes`` is refused with a
        ``limit`` error; a known member's beat is always taken, and a new info of it that does
        not fit is not kept (a warning says so: its old info stays)."""
        known = self._members.get(name)
        if known is None or (info and info != known.info):
            size = MEMBER_BYTES + len(name) + (len(msgpack.packb(info, use_bin_type=True)) if info else 0)
            held = self.held_bytes + size - (known.size if known is not None else 0)
            if held <= max_bytes:
                self.held_bytes = held
                if known is None:
                    if not self._members:
                        self.next_check = now + HEARTBEAT_CHECK_S
                    self._members[name] = Member(limit, now, info, size=size)
                    return None
                known.size, known.info = size, info
            elif known is None:
                raise ProtocolViolation("limit", f"heartbeat of {name!r}: its {size} bytes would pass the server's "
                                                 f"limit of {max_bytes} bytes of heartbeat members "
                                                 f"(it holds {self.held_bytes} for {len(self._members)})")
            else:
                _log.warning("heartbeat of %s: its new info (%d bytes) is not kept, past the limit of %d bytes "
                             "of heartbeat members", name, size, max_bytes)
        heard = None
        if known.silent:
            known.silent = False
            heard = (RANK_HEARD, {**_rank_fields(name, known),
                                  "silent_s": round(now - known.last_seen, 3)})
        known.last_seen, known.limit = now, limit
        return heard

    def pace(self, name: str, interval: float | None, limit: float, max_rate: float
             ) -> tuple[float, float]:
        """The interval ``name`` is asked to beat at and the silence limit it is judged by, so
        that all members together send at most ``max_rate`` beats a second: a member beating
        more often than ``len(members) / max_rate`` is slowed to it, and its limit is
        stretched by the same factor (for a member that does not say its interval, to at least
        four paced intervals)."""
        count = len(self._members) + (name not in self._members)
        paced = count / max_rate
        if interval:
            if paced > interval:
                return paced, limit * paced / interval
            return interval, limit
        return paced, max(limit, 4 * paced)

    def forget(self, name: str) -> bool:
        """Stop tracking ``name``; returns whether it was tracked."""
        member = self._members.pop(name, None)
        if member is None:
            return False
        self.held_bytes -= member.size
        return True

    def check(self, now: float) -> list[EventSpec]:
        """The events of members silent past their limit (lost ones are forgotten)."""
        if not self._members or now < self.next_check:
            return []
        self.next_check = now + HEARTBEAT_CHECK_S
        events: list[EventSpec] = []
        lost = [(name, m) for name, m in self._members.items()
                if not m.silent and now - m.last_seen > m.limit]
        for name, member in lost:
            silent = now - member.last_seen
            if self.rank_silence == "suspect" and _rank_of(name) is not None:
                member.silent = True  # kept: its next beat is published as ``rank_heard``
                events.append((RANK_SILENT, {**_rank_fields(name, member),
                                             "silent_s": round(silent, 3)}))
                continue
            self.forget(name)
            _log.warning("member %s sent no heartbeat for %.2f s (limit %.2f s)",
                         name, silent, member.limit)
            events.append(_lost_event(name, member, silent))
        return events
