"""The server's key-value store and its parked requests: the values, the queues, and the
blocking requests (``get``, ``wait``, ``multi_get``, ``queue_pop``, ``events``) waiting for a
key, an item or an event until their deadline. Touched by the serving thread only; answers go
out through the :class:`Replies` it is given."""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import protocol as proto
from .events import Event
from .protocol import Limits, ProtocolViolation, Request

#: what a parked request and each key it waits for hold besides the key's characters (a Python
#: ``str`` of ASCII is 49 bytes and its length): counted toward ``Limits.max_pending_bytes``
OBJECT_BYTES = 64

__all__ = ["KeyValueStore", "Waiter", "Replies"]


class Replies(Protocol):
    """Where the store's answers go (the server's socket)."""

    def ok(self, identity: bytes, request_id: int, value: Any = None) -> None: ...

    def ok_packed(self, identity: bytes, request_id: int, packed_value: bytes) -> None:
        """``ok`` with the value already packed (``protocol.encode(value)``)."""

    def error(self, identity: bytes, request_id: int | None, code: str, message: str,
              keys: list[str] | None = None) -> None: ...


@dataclass(eq=False)
class Waiter:
    """A parked request."""

    identity: bytes
    request_id: int
    op: str
    keys: list[str]
    deadline: float
    started: float
    args: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    #: keys it is registered under that were not set yet (a ``put`` counts one down; at
    #: zero the keys are looked up once, so waking N waiters of N keys costs O(N) lookups
    #: per waiter, not one full lookup per key set)
    unset: int = 0
    #: what it counts toward ``Limits.max_pending_bytes`` while parked
    held: int = 0


class KeyValueStore:
    """Values, queues and parked requests; ``op_<name>`` answers the request of op ``name``."""

    def __init__(self, limits: Limits, replies: Replies, max_pending: int) -> None:
        self.limits = limits
        self._replies = replies
        self._max_pending = max_pending
        self.data: dict[str, bytes] = {}
        self._queues: dict[str, deque[bytes]] = {}
        self.waiters_by_key: dict[str, list[Waiter]] = {}
        self.queue_waiters: dict[str, deque[Waiter]] = {}
        self.event_waiters: list[Waiter] = []
        self._deadlines: list[tuple[float, int, Waiter]] = []
        self._tiebreak = itertools.count()
        #: parked requests not answered yet, and the bytes of the keys they wait for
        self.pending = 0
        self.pending_bytes = 0
        #: bytes of the keys and values held (queued items included): see :meth:`_make_room`
        self.held_bytes = 0

    def next_deadline(self) -> float | None:
        """The earliest deadline of a parked request, if any."""
        return self._deadlines[0][0] if self._deadlines else None

    def pop(self, key: str) -> bool:
        """Drop ``key`` (nobody is woken); returns whether it was there."""
        value = self.data.pop(key, None)
        if value is None:
            return False
        self.held_bytes -= len(key) + len(value)
        return True

    def drop_all_but(self, keep: tuple[str, ...]) -> int:
        """Drop every value and queue whose key starts with none of the prefixes ``keep``
        (nobody is woken); returns how many keys were dropped."""
        doomed = [k for k in self.data if not k.startswith(keep)]
        for key in doomed:
            self.pop(key)
        queues = [k for k in self._queues if not k.startswith(keep)]
        for key in queues:
            self.held_bytes -= sum(map(len, self._queues.pop(key)))
        return len(doomed) + len(queues)

    def park_events(self, identity: bytes, req: Request) -> None:
        """Park an ``events`` request until an event it asks for is published."""
        self.event_waiters.append(self.park(identity, req, []))

    def wake_event_waiters(self, topic: str,
                           find: Callable[[int, list[str] | None], list[Event]]) -> None:
        """Answer the ``events`` requests that an event on ``topic`` completes. Subscribers that
        asked alike (the same ``since`` and topics: every rank of a job, at a failure) share one
        lookup and one packed answer."""
        still_waiting: list[Waiter] = []
        answers: dict[tuple[int, tuple[str, ...] | None], bytes] = {}
        for waiter in self.event_waiters:
            if waiter.done:
                continue
            topics = waiter.args.get("topics")
            if topics is not None and topic not in topics:
                still_waiting.append(waiter)
                continue
            since = waiter.args["since"]
            asked = (since, tuple(topics) if topics is not None else None)
            packed = answers.get(asked)
            if packed is None:
                packed = answers[asked] = proto.encode([e.to_wire() for e in find(since, topics)])
            self.finish(waiter)
            self._replies.ok_packed(waiter.identity, waiter.request_id, packed)
        self.event_waiters = still_waiting

    def op_set(self, identity: bytes, req: Request) -> None:
        self.put(req.args["key"], req.args["value"])
        self._replies.ok(identity, req.id)

    def op_multi_set(self, identity: bytes, req: Request) -> None:
        pairs = list(zip(req.args["keys"], req.args["values"]))
        final = dict(pairs)  # a key given twice ends with its last value
        self._make_room(f"{len(final)} keys",
                        sum(self._growth(key, value) for key, value in final.items()))
        for key, value in pairs:  # all or nothing: room was made for the end state
            self.put(key, value, bounded=False)
        self._replies.ok(identity, req.id)

    def op_get(self, identity: bytes, req: Request) -> None:
        self._get_or_park(identity, req, [req.args["key"]])

    def op_multi_get(self, identity: bytes, req: Request) -> None:
        self._get_or_park(identity, req, req.args["keys"])

    def op_wait(self, identity: bytes, req: Request) -> None:
        self._get_or_park(identity, req, req.args["keys"])

    def op_add(self, identity: bytes, req: Request) -> None:
        key, delta = req.args["key"], req.args["delta"]
        current = self.data.get(key)
        base = 0
        if current is not None:
            try:
                base = int(current.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                raise ProtocolViolation(
                    "value", f"add: key {key!r} holds a value that is not an integer") from None
        result = base + delta
        if not proto.INT64_MIN <= result <= proto.INT64_MAX:
            raise ProtocolViolation("value", f"add: key {key!r} would overflow int64")
        self.put(key, str(result).encode("ascii"))
        self._replies.ok(identity, req.id, result)

    def op_compare_set(self, identity: bytes, req: Request) -> None:
        key, expected, desired = req.args["key"], req.args["expected"], req.args["desired"]
        current = self.data.get(key)
        if current is None:
            if expected == b"":
                self.put(key, desired)
                result = desired
            else:
                result = expected
        elif current == expected:
            self.put(key, desired)
            result = desired
        else:
            result = current
        self._replies.ok(identity, req.id, result)

    def op_append(self, identity: bytes, req: Request) -> None:
        key, value = req.args["key"], req.args["value"]
        current = self.data.get(key, b"")
        if len(current) + len(value) > self.limits.max_value_bytes:
            raise ProtocolViolation("limit", f"append: key {key!r} would exceed the value limit "
                                             f"of {self.limits.max_value_bytes} bytes")
        self.put(key, current + value)
        self._replies.ok(identity, req.id)

    def op_delete(self, identity: bytes, req: Request) -> None:
        self._replies.ok(identity, req.id, self.pop(req.args["key"]))

    def op_delete_prefix(self, identity: bytes, req: Request) -> None:
        prefix = req.args["prefix"]
        doomed = [key for key in self.data if key.startswith(prefix)]
        for key in doomed:
            self.pop(key)
        self._replies.ok(identity, req.id, len(doomed))

    def op_check(self, identity: bytes, req: Request) -> None:
        self._replies.ok(identity, req.id, all(key in self.data for key in req.args["keys"]))

    def op_keys(self, identity: bytes, req: Request) -> None:
        prefix = req.args["prefix"]
        self._replies.ok(identity, req.id, sorted(k for k in self.data if k.startswith(prefix)))

    def op_num_keys(self, identity: bytes, req: Request) -> None:
        self._replies.ok(identity, req.id, len(self.data))

    def op_queue_push(self, identity: bytes, req: Request) -> None:
        key, value = req.args["key"], req.args["value"]
        self._make_room(f"an item of queue {key!r}", len(value))
        self._queues.setdefault(key, deque()).append(value)
        self.held_bytes += len(value)
        self._replies.ok(identity, req.id)
        self._serve_queue(key)

    def op_queue_pop(self, identity: bytes, req: Request) -> None:
        key = req.args["key"]
        items = self._queues.get(key)
        if items:
            self._replies.ok(identity, req.id, self._pop_queue(key))
            return
        if not req.args.get("block", True) or req.args.get("timeout") == 0:
            raise ProtocolViolation("timeout", f"queue_pop: queue {key!r} is empty")
        waiter = self.park(identity, req, [key])
        self.queue_waiters.setdefault(key, deque()).append(waiter)

    def op_queue_len(self, identity: bytes, req: Request) -> None:
        self._replies.ok(identity, req.id, len(self._queues.get(req.args["key"], ())))

    def _growth(self, key: str, value: bytes) -> int:
        old = self.data.get(key)
        return len(value) - len(old) if old is not None else len(key) + len(value)

    def _make_room(self, what: str, growth: int) -> None:
        """Refuse (a ``limit`` error) what would grow the store past ``Limits.max_store_bytes``:
        a client storing without end would otherwise take the host's memory, and with it the
        job's control plane."""
        if growth > 0 and self.held_bytes + growth > self.limits.max_store_bytes:
            raise ProtocolViolation(
                "limit", f"storing {what} ({growth} bytes more) would pass the store's limit of "
                         f"{self.limits.max_store_bytes} bytes (it holds {self.held_bytes}); "
                         "delete keys or drain queues first")

    def put(self, key: str, value: bytes, *, bounded: bool = True) -> None:
        """Store ``value`` and wake whoever waits for ``key``. ``bounded=False`` is for the
        server's own records (events), which are never refused."""
        growth = self._growth(key, value)
        if bounded:
            self._make_room(f"key {key!r}", growth)
        self.data[key] = value
        self.held_bytes += growth
        waiters = self.waiters_by_key.pop(key, None)
        if waiters:
            for waiter in waiters:
                if not waiter.done:
                    self._try_complete(waiter)

    def _missing(self, keys: list[str]) -> list[str]:
        return [key for key in keys if key not in self.data]

    def _get_or_park(self, identity: bytes, req: Request, keys: list[str]) -> None:
        missing = self._missing(keys)
        if not missing:
            self._replies.ok(identity, req.id, self._result(req.op, keys))
            return
        if req.args.get("timeout") == 0:
            raise ProtocolViolation("timeout", f"{req.op}: keys not present: {missing[:8]}")
        waiter = self.park(identity, req, keys)
        self._register(waiter, missing)

    def _register(self, waiter: Waiter, missing: list[str]) -> None:
        distinct = list(dict.fromkeys(missing))
        waiter.unset = len(distinct)
        for key in distinct:
            self.waiters_by_key.setdefault(key, []).append(waiter)

    def _result(self, op: str, keys: list[str]) -> Any:
        if op == "get":
            return self.data[keys[0]]
        if op == "multi_get":
            return [self.data[key] for key in keys]
        return None

    def park(self, identity: bytes, req: Request, keys: list[str]) -> Waiter:
        """Hold ``req`` until its keys are set or its deadline passes. Refused (a ``limit``
        error) past ``max_pending`` parked requests or ``Limits.max_pending_bytes`` of the keys
        they wait for, so that members blocking on many large keys cannot exhaust the server's
        memory."""
        if self.pending >= self._max_pending:
            raise ProtocolViolation("limit", f"{req.op}: the server already holds "
                                             f"{self._max_pending} blocked requests")
        held = OBJECT_BYTES * (1 + len(keys)) + sum(map(len, keys))
        if self.pending_bytes + held > self.limits.max_pending_bytes:
            noun = "key" if len(keys) == 1 else "keys"
            raise ProtocolViolation("limit", f"{req.op}: blocking on {len(keys)} {noun} ({held} bytes) would pass the "
                                             f"server's limit of {self.limits.max_pending_bytes} bytes of blocked "
                                             f"requests (it holds {self.pending_bytes} in {self.pending})")
        timeout = req.args.get("timeout")
        now = time.monotonic()
        deadline = now + (proto.MAX_TIMEOUT_S if timeout is None else timeout)
        waiter = Waiter(identity, req.id, req.op, keys, deadline, now, dict(req.args), held=held)
        heapq.heappush(self._deadlines, (deadline, next(self._tiebreak), waiter))
        self.pending += 1
        self.pending_bytes += held
        return waiter

    def finish(self, waiter: Waiter) -> None:
        waiter.done = True
        self.pending -= 1
        self.pending_bytes -= waiter.held

    def _try_complete(self, waiter: Waiter) -> None:
        waiter.unset -= 1
        if waiter.unset > 0:
            return
        missing = self._missing(waiter.keys)
        if missing:  # a key was deleted meanwhile; keep waiting for what is missing
            self._register(waiter, missing)
            return
        self.finish(waiter)
        self._replies.ok(waiter.identity, waiter.request_id, self._result(waiter.op, waiter.keys))

    def _pop_queue(self, key: str) -> bytes:
        items = self._queues[key]
        value = items.popleft()
        self.held_bytes -= len(value)
        if not items:
            del self._queues[key]
        return value

    def _serve_queue(self, key: str) -> None:
        waiters = self.queue_waiters.get(key)
        while waiters and self._queues.get(key):
            waiter = waiters.popleft()
            if waiter.done:
                continue
            self.finish(waiter)
            self._replies.ok(waiter.identity, waiter.request_id, self._pop_queue(key))
        if waiters is not None and not waiters:
            del self.queue_waiters[key]

    def expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, waiter = heapq.heappop(self._deadlines)
            if waiter.done:
                continue
            self.finish(waiter)
            self._unlist(waiter)
            waited = now - waiter.started
            if waiter.op == "events":
                self._replies.ok(waiter.identity, waiter.request_id, [])
                continue
            missing = self._missing(waiter.keys) if waiter.op != "queue_pop" else waiter.keys
            self._replies.error(
                waiter.identity, waiter.request_id, "timeout",
                f"{waiter.op} timed out after {waited:.3f} s waiting for "
                f"{'queue' if waiter.op == 'queue_pop' else 'keys'} {missing[:8]}"
                + (f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""),
                missing[:64])
        if self.pending == 0:
            self.event_waiters.clear()
            self.queue_waiters.clear()
        elif len(self.event_waiters) > 2 * self.pending + 64:
            self.event_waiters = [w for w in self.event_waiters if not w.done]

    def _unlist(self, waiter: Waiter) -> None:
        """Forget an expired waiter under the keys it was waiting for (nobody set them)."""
        if waiter.op == "queue_pop":
            line = self.queue_waiters.get(waiter.keys[0])
            if line is not None:
                try:
                    line.remove(waiter)
                except ValueError:
                    pass
                if not line:
                    del self.queue_waiters[waiter.keys[0]]
            return
        for key in waiter.keys:
            bucket = self.waiters_by_key.get(key)
            if bucket is None:
                continue
            try:
                bucket.remove(waiter)
            except ValueError:
                continue
            if not bucket:
                del self.waiters_by_key[key]

    def fail_all(self, message: str) -> None:
        for _, _, waiter in self._deadlines:
            if not waiter.done:
                self.finish(waiter)
                self._replies.error(waiter.identity, waiter.request_id, "unavailable", message)
        self._deadlines.clear()
