"""Thread-safe client of the control-plane server.

Each request travels on a ZeroMQ DEALER socket borrowed from a small pool, so any number of
threads can block in ``get``/``wait`` at once while others keep using the store. Requests
carry ids (stale replies are discarded), every call has a deadline, and failures are typed:
:class:`ControlTimeoutError` (the server answered "not in time"), :class:`ControlAuthError`
(the server refused our credentials), :class:`ControlUnavailableError` (no server, or it went
away: requests are never silently retried; :class:`ControlHandshakeTimeoutError` when a
connection was made but its handshake never answered), :class:`ControlProtocolError`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from torchcomms.config import settings

from . import protocol as proto
from .arguments import (
    check_address,
    check_key,
    check_key_list,
    check_member,
    check_prefix,
    check_topics,
    check_value,
    seconds,
)
from .connection import REPLY_GRACE_S, Channel, Connection
from .errors import (
    ControlArgumentError,
    ControlArgumentTypeError,
    ControlError,
    ControlProtocolError,
)
from .events import EventSchemaError, validate_event
from .heartbeat import HeartbeatSender, heartbeat_budget
from .host_process import host_running_check
from .protocol import Limits, ProtocolViolation
from .replies import decode_events, expect_reply, expect_values
from .secrets import derive_keys
from .subscription import DEFAULT_CONTROL_LOST_S, EventCallback, Subscription

__all__ = ["ControlClient", "Subscription", "EventCallback", "DEFAULT_TIMEOUT_S",
           "DEFAULT_HEARTBEAT_INTERVAL_S", "DEFAULT_CONTROL_LOST_S", "heartbeat_budget"]

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_HEARTBEAT_INTERVAL_S = 0.25

_log = logging.getLogger("torchcomms.control.client")


class ControlClient:
    """Client of a :class:`~torchcomms.control.server.StoreServer` (thread-safe).

    ``addr`` is ``tcp://host:port``; ``secret`` the per-job secret; ``timeout`` (seconds) the
    default deadline of every call, also the default wait of ``get``/``wait``.
    """

    def __init__(self, addr: str, secret: bytes, *, timeout: float | timedelta = DEFAULT_TIMEOUT_S,
                 limits: Limits | None = None) -> None:
        self.address = check_address(addr)
        self.limits = limits or Limits()
        budget = seconds(timeout, "timeout", allow_none=False)
        assert budget is not None
        self._conn = Connection(self.address, derive_keys(secret), budget, self.limits)
        self._lock = threading.Lock()
        self._subscriptions: set[Subscription] = set()
        self._heartbeats: dict[str, HeartbeatSender] = {}

    # ------------------------------------------------------------------ plumbing

    @property
    def timeout(self) -> float:
        """Default deadline (seconds) of every call."""
        return self._conn.timeout

    @timeout.setter
    def timeout(self, value: float | timedelta) -> None:
        budget = seconds(value, "timeout", allow_none=False)
        assert budget is not None
        self._conn.timeout = budget

    @property
    def closed(self) -> bool:
        return self._conn.closed

    def cancel_calls_of(self, thread: threading.Thread) -> None:
        """Fail the call ``thread`` is blocked in (within ~0.1 s) and every later one it makes
        through this client with :class:`ControlCancelledError`: for a thread whose caller gave
        up on it (an engine's rendezvous abandoned at its deadline, say), so that it ends
        instead of waiting on a server that does not answer. Other threads are not affected."""
        self._conn.cancel_calls_of(thread)

    def _call(self, op: str, fields: dict[str, Any], *, budget: float,
              channel: Channel | None = None, stop: threading.Event | None = None) -> Any:
        """Send one request and wait (at most ``budget`` seconds) for its reply's value."""
        return self._conn.call(op, fields, budget=budget, channel=channel, stop=stop)

    def _wait_budget(self, timeout: Any) -> tuple[float, float]:
        wait = seconds(timeout, "timeout")
        wait = self.timeout if wait is None else min(wait, proto.MAX_TIMEOUT_S)
        return wait, wait + REPLY_GRACE_S

    # ------------------------------------------------------------------ key-value API
    # ------------------------------------------------------------------ key-value API

    def hello(self, timeout: float | timedelta | None = None) -> dict[str, Any]:
        """Handshake with the server (within ``timeout``, default the client's); returns its
        protocol version, run id, limits and the last event's sequence number."""
        budget = seconds(timeout, "timeout")
        info = self._call("hello", {}, budget=self.timeout if budget is None else budget)
        if not isinstance(info, dict):
            raise ControlProtocolError("malformed hello reply from the control server")
        return info

    def ping(self, timeout: float | timedelta | None = None) -> float:
        """Round-trip one request (within ``timeout``, default the client's); returns the
        latency in seconds."""
        budget = self.timeout if timeout is None else seconds(timeout, "timeout")
        start = time.perf_counter()
        self._call("ping", {}, budget=budget or 0.0)
        return time.perf_counter() - start

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (wakes everyone waiting for it)."""
        self._call("set", {"key": check_key(key, self.limits), "value": check_value(value, self.limits)},
                   budget=self.timeout)

    def get(self, key: str, timeout: float | timedelta | None = None) -> bytes:
        """Return the value of ``key``, waiting up to ``timeout`` for it to be set."""
        wait, budget = self._wait_budget(timeout)
        return expect_reply("get", self._call("get", {"key": check_key(key, self.limits), "timeout": wait},
                                         budget=budget), bytes)

    def add(self, key: str, delta: int) -> int:
        """Atomically add ``delta`` to the integer under ``key`` (0 if absent); returns it."""
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise ControlArgumentTypeError(f"delta must be an int, got {type(delta).__name__}")
        if not proto.INT64_MIN <= delta <= proto.INT64_MAX:
            raise ControlArgumentError(f"delta {delta} is outside the int64 range")
        return expect_reply("add", self._call("add", {"key": check_key(key, self.limits), "delta": delta},
                                         budget=self.timeout), int)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is absent and ``expected``
        is empty); returns the value the key holds afterwards (c10d semantics)."""
        value = self._call("compare_set", {"key": check_key(key, self.limits),
                                           "expected": check_value(expected, self.limits, "expected"),
                                           "desired": check_value(desired, self.limits, "desired")},
                           budget=self.timeout)
        return expect_reply("compare_set", value, bytes)

    def delete(self, key: str) -> bool:
        """Delete ``key``; returns whether it existed."""
        return expect_reply("delete", self._call("delete", {"key": check_key(key, self.limits)},
                                            budget=self.timeout), bool)

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with ``prefix``; returns how many were deleted."""
        return expect_reply("delete_prefix", self._call("delete_prefix", {"prefix": check_prefix(prefix, self.limits)},
                                                   budget=self.timeout), int)

    def check(self, keys: str | Iterable[str]) -> bool:
        """Whether all ``keys`` are present (does not wait)."""
        return expect_reply("check", self._call("check", {"keys": check_key_list(keys, self.limits)},
                                           budget=self.timeout), bool)

    def wait(self, keys: str | Iterable[str], timeout: float | timedelta | None = None) -> None:
        """Block until all ``keys`` are present; :class:`ControlTimeoutError` after
        ``timeout`` seconds (default: the client's timeout) names the missing ones."""
        wait, budget = self._wait_budget(timeout)
        self._call("wait", {"keys": check_key_list(keys, self.limits), "timeout": wait}, budget=budget)

    def keys(self, prefix: str = "") -> list[str]:
        """All keys starting with ``prefix``, sorted."""
        value = self._call("keys", {"prefix": check_prefix(prefix, self.limits)}, budget=self.timeout)
        return expect_reply("keys", value, list, str)

    def num_keys(self) -> int:
        """Number of keys in the store (event records under ``events/`` included)."""
        return expect_reply("num_keys", self._call("num_keys", {}, budget=self.timeout), int)

    def append(self, key: str, value: bytes) -> None:
        """Append ``value`` to the bytes under ``key`` (creating it if absent)."""
        self._call("append", {"key": check_key(key, self.limits), "value": check_value(value, self.limits)},
                   budget=self.timeout)

    def multi_get(self, keys: Iterable[str], timeout: float | timedelta | None = None
                  ) -> list[bytes]:
        """Values of all ``keys``, waiting up to ``timeout`` for all of them."""
        wait, budget = self._wait_budget(timeout)
        key_list = check_key_list(keys, self.limits)
        return expect_values("multi_get", self._call("multi_get", {"keys": key_list, "timeout": wait},
                                                     budget=budget), len(key_list))

    def multi_set(self, keys: Iterable[str], values: Iterable[bytes]) -> None:
        """Set several keys in one request."""
        key_list = check_key_list(list(keys) if not isinstance(keys, str) else keys, self.limits)
        value_list = [check_value(v, self.limits, f"values[{i}]") for i, v in enumerate(values)]
        if len(key_list) != len(value_list):
            raise ControlArgumentError(
                f"multi_set: {len(key_list)} keys but {len(value_list)} values")
        self._call("multi_set", {"keys": key_list, "values": value_list}, budget=self.timeout)

    def queue_push(self, key: str, value: bytes) -> None:
        """Push ``value`` to the back of the queue ``key``."""
        self._call("queue_push", {"key": check_key(key, self.limits), "value": check_value(value, self.limits)},
                   budget=self.timeout)

    def queue_pop(self, key: str, block: bool = True,
                  timeout: float | timedelta | None = None) -> bytes:
        """Pop the front of the queue ``key``; waits up to ``timeout`` when ``block``."""
        if not isinstance(block, bool):
            raise ControlArgumentTypeError(f"block must be a bool, got {type(block).__name__}")
        wait, budget = self._wait_budget(timeout)
        return expect_reply("queue_pop", self._call("queue_pop", {"key": check_key(key, self.limits), "block": block,
                                                             "timeout": wait}, budget=budget), bytes)

    def queue_len(self, key: str) -> int:
        """Number of items in the queue ``key``."""
        return expect_reply("queue_len", self._call("queue_len", {"key": check_key(key, self.limits)},
                                               budget=self.timeout), int)

    # ------------------------------------------------------------------ events

    def publish(self, topic: str, payload: dict[str, Any]) -> int:
        """Publish an event on the bus; returns its sequence number."""
        if not isinstance(payload, dict):
            raise ControlArgumentTypeError(
                f"payload must be a dict, got {type(payload).__name__}")
        try:
            validate_event(topic, payload)
            proto.check_payload(payload, self.limits)
        except (EventSchemaError, ProtocolViolation) as exc:
            raise ControlArgumentError(f"cannot publish {topic!r}: {exc}") from None
        return expect_reply("publish", self._call("publish", {"topic": topic, "payload": payload},
                                             budget=self.timeout), int)

    def events(self, since: int = 0, topics: str | Iterable[str] | None = None,
               timeout: float | timedelta | None = 0.0) -> list[tuple[int, str, dict[str, Any]]]:
        """Events after sequence number ``since`` as ``(seq, topic, payload)``; with a
        ``timeout`` > 0 waits that long for at least one."""
        if isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise ControlArgumentError(f"since must be an int >= 0, got {since!r}")
        wait, budget = self._wait_budget(timeout)
        fields: dict[str, Any] = {"since": since, "timeout": wait}
        topic_list = check_topics(topics)
        if topic_list is not None:
            fields["topics"] = topic_list
        return decode_events(self._call("events", fields, budget=budget))

    def subscribe(self, topics: str | Iterable[str] | None, callback: EventCallback, *,
                  since: int | None = 0,
                  on_error: Callable[[ControlError], None] | None = None,
                  lost_after: float | None = None) -> Subscription:
        """Call ``callback(topic, payload)`` on a background thread for every event of
        ``topics`` (``None``: all). ``since=0`` first replays every earlier event;
        ``since=None`` delivers only events published from now on. The payload carries the
        event's ``seq``. ``on_error`` hears about a lost server: one that has answered no poll
        for ``lost_after`` seconds after a first failed one (default ``TORCHCOMM_CONTROL_LOST_S``
        or 8, so at least two polls in a row went unanswered; a slow reply
        on a starved box is retried, not reported; with ``TORCHCOMM_CONTROL_PID`` naming the
        server's process on this host, never while that process runs); delivery resumes, without
        gaps, once the same server answers again (a restarted server starts a new history)."""
        if not callable(callback):
            raise ControlArgumentTypeError("callback must be callable")
        if since is None:
            since = expect_reply("hello", self.hello().get("last_event_seq"), int)
        elif isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise ControlArgumentError(f"since must be an int >= 0 or None, got {since!r}")
        topic_list = check_topics(topics)
        self._conn.check_open()
        if lost_after is None:
            lost_after = settings().control_lost_s
        patience = seconds(lost_after, "lost_after", allow_none=False)
        assert patience is not None
        subscription = Subscription(self._conn, topic_list, callback, since, on_error, patience,
                                    on_close=self._forget_subscription,
                                    host_running=host_running_check(settings().control_pid))
        with self._lock:
            self._subscriptions.add(subscription)
        return subscription

    def _forget_subscription(self, subscription: Subscription) -> None:
        with self._lock:
            self._subscriptions.discard(subscription)

    # ------------------------------------------------------------------ heartbeats

    def heartbeat_start(self, member: str, interval: float | timedelta | None = None, *,
                        limit: float | timedelta | None = None,
                        info: dict[str, Any] | None = None,
                        timeout: float | timedelta | None = None) -> None:
        """Send heartbeats for ``member`` (e.g. ``"rank/3"``) every ``interval`` seconds
        (default ``TORCHCOMM_HEARTBEAT_S`` or 0.25) from a background thread. The first one
        is sent before returning (within ``timeout``, default the client's). ``limit``
        overrides the server's silence limit for this member; ``info`` (e.g. ``{"host": ...,
        "pid": ...}``) is attached to loss events."""
        first_budget = seconds(timeout, "timeout")
        check_member(member)
        if interval is None:
            interval = settings().heartbeat_s
        beat = seconds(interval, "interval", allow_none=False)
        assert beat is not None
        if beat <= 0:
            raise ControlArgumentError("interval must be > 0 seconds")
        if limit is None and settings().source("TORCHCOMM_HEARTBEAT_LIMIT_S"):
            limit = settings().heartbeat_limit_s  # else the server's own limit
        silence = seconds(limit, "limit")
        if silence is not None and silence <= beat:
            raise ControlArgumentError(
                f"limit ({silence} s) must be longer than the interval ({beat} s)")
        if info is not None:
            if not isinstance(info, dict):
                raise ControlArgumentTypeError(f"info must be a dict, got {type(info).__name__}")
            try:
                proto.check_payload(info, self.limits, name="info")
            except ProtocolViolation as exc:
                raise ControlArgumentError(exc.message) from None
        with self._lock:
            if member in self._heartbeats:
                raise ControlArgumentError(f"heartbeats for {member!r} are already running")
        heartbeat = HeartbeatSender(self._conn, member, beat, silence, info)
        heartbeat.beat_once(first_budget)
        with self._lock:
            self._heartbeats[member] = heartbeat
        heartbeat.start()

    def heartbeat_stop(self, member: str | None = None, *,
                       timeout: float | timedelta | None = None, deregister: bool = True) -> None:
        """Stop heartbeats (of ``member``, or all) and deregister them from the server, so
        that a clean exit is not reported as a failure (``timeout``: for the deregistration,
        default the client's, at most 5 s). A heartbeat whose last beat went unanswered is
        deregistered within one heartbeat interval instead: its server is stopped, hung or
        gone, and an exit must not wait the whole timeout on it. With ``deregister=False``
        only the beats stop: the server keeps the member, whose silence it then reports (or
        whose supervisor forgets it, as for a process that ended without deregistering)."""
        budget = seconds(timeout, "timeout")
        budget = min(self.timeout, 5.0) if budget is None else budget
        with self._lock:
            names = list(self._heartbeats) if member is None else [member]
            stopping = [self._heartbeats.pop(n) for n in names if n in self._heartbeats]
        if member is not None and not stopping:
            raise ControlArgumentError(f"no heartbeats are running for {member!r}")
        for heartbeat in stopping:
            heartbeat.stop()
            if not deregister:
                continue
            wait = min(budget, heartbeat.interval) if heartbeat.failing else budget
            self._call("heartbeat_stop", {"member": heartbeat.member}, budget=wait)

    def heartbeat_forget(self, member: str, *, timeout: float | timedelta | None = None) -> bool:
        """Deregister ``member``, whoever sent its heartbeats (a supervisor forgetting a
        worker that exited, so its silence is not reported later). Returns whether the server
        knew it."""
        check_member(member)
        budget = seconds(timeout, "timeout")
        return expect_reply("heartbeat_stop", self._call("heartbeat_stop", {"member": member},
                                                    budget=self.timeout if budget is None else budget), bool)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop heartbeats (deregistering them) and subscriptions, close the sockets.
        Calls blocked in other threads raise :class:`ControlClosedError`. Idempotent."""
        if self._conn.closed:
            return
        try:
            self.heartbeat_stop(timeout=1.0)
        except ControlError as exc:
            _log.debug("could not deregister heartbeats on close: %s", exc)
        with self._lock:
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            subscription.close()
        self._conn.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"ControlClient({self.address!r}, timeout={self.timeout}, {state})"

    def __reduce__(self) -> Any:
        raise TypeError("ControlClient cannot be pickled: pass the address and secret instead")
