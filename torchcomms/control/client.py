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

import itertools
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import zmq

from . import protocol as proto
from .auth import MONITOR_EVENTS, HandshakeWatch, configure_client_socket
from torchcomms.config import settings
from .errors import (
    ControlArgumentError,
    ControlArgumentTypeError,
    ControlCancelledError,
    ControlClosedError,
    ControlError,
    ControlHandshakeTimeoutError,
    ControlProtocolError,
    ControlUnavailableError,
)
from .events import Event, EventSchemaError, validate_event, validate_topic
from .protocol import Limits, ProtocolViolation
from .secrets import derive_keys

__all__ = ["ControlClient", "Subscription", "EventCallback", "DEFAULT_TIMEOUT_S",
           "DEFAULT_HEARTBEAT_INTERVAL_S", "DEFAULT_CONTROL_LOST_S"]

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_HEARTBEAT_INTERVAL_S = 0.25
_REPLY_GRACE_S = 2.0  # how long past a server-side wait we wait for its answer
_POLL_SLICE_S = 0.1  # blocked calls notice close() within this
_SUBSCRIBE_POLL_S = 5.0
#: How long a subscription goes unanswered before the server is taken for lost (``on_error``):
#: one slow reply on a starved box is not a lost control plane.
DEFAULT_CONTROL_LOST_S = 8.0

EventCallback = Callable[[str, dict[str, Any]], None]
_log = logging.getLogger("torchcomms.control.client")


def _seconds(value: Any, name: str, *, allow_none: bool = True) -> float | None:
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


def _check_address(addr: Any) -> str:
    if not isinstance(addr, str):
        raise ControlArgumentTypeError(f"addr must be a str like 'tcp://host:port', "
                                       f"got {type(addr).__name__}")
    if not addr.startswith("tcp://") or ":" not in addr[6:]:
        raise ControlArgumentError(f"addr must look like 'tcp://host:port', got {addr!r}")
    port = addr.rsplit(":", 1)[1]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ControlArgumentError(f"addr {addr!r} has no valid port")
    return addr


class _Channel:
    """One DEALER socket with its monitor; used by one thread at a time."""

    def __init__(self, ctx: zmq.Context, addr: str, keys: Any, handshake_s: float) -> None:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.setsockopt(zmq.HANDSHAKE_IVL, max(100, int(handshake_s * 1000)))
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
        sock.setsockopt(zmq.HEARTBEAT_TTL, 6000)
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        if addr.startswith("tcp://["):
            sock.setsockopt(zmq.IPV6, 1)
        configure_client_socket(sock, keys)
        self.monitor = sock.get_monitor_socket(MONITOR_EVENTS)
        sock.connect(addr)
        self.sock = sock
        self.watch = HandshakeWatch(addr)
        self.poller = zmq.Poller()
        self.poller.register(sock, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)

    def drain_monitor(self) -> None:
        while self.monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.watch.feed(frames)

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(0)
        self.sock.close(0)


class Subscription:
    """A running subscription; events are delivered to the callback on its own thread."""

    def __init__(self, client: ControlClient, topics: list[str] | None, callback: EventCallback,
                 since: int, on_error: Callable[[ControlError], None] | None,
                 lost_after: float = DEFAULT_CONTROL_LOST_S) -> None:
        self._client = client
        self.topics = topics
        self._callback = callback
        self._on_error = on_error
        self.lost_after = lost_after
        self.last_seq = since
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchcomms-control-subscription",
                                        daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def close(self, timeout: float = 2.0) -> None:
        """Stop delivering events (idempotent; safe to call from the callback)."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        self._client._forget_subscription(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        client = self._client
        channel: _Channel | None = None
        failing_since: float | None = None  # first unanswered poll of the current outage
        reported = False
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if channel is None:
                    channel = client._new_channel()
                fields: dict[str, Any] = {"since": self.last_seq, "timeout": _SUBSCRIBE_POLL_S}
                if self.topics is not None:
                    fields["topics"] = self.topics
                items = client._call("events", fields, budget=_SUBSCRIBE_POLL_S + _REPLY_GRACE_S,
                                     channel=channel, stop=self._stop)
                if failing_since is not None:
                    _log.info("event subscription answered again after %.1f s",
                              time.monotonic() - failing_since)
                failing_since, reported = None, False
            except ControlClosedError:
                break
            except ControlError as exc:
                # The server closed the connection (its process is gone): lost at once. No
                # reply in time is only slowness until it lasts ``lost_after``.
                closed = channel is not None and channel.watch.lost
                if channel is not None:
                    client._discard_channel(channel)
                    channel = None
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    _log.info("event subscription: no answer yet (%s); retrying", exc)
                if not reported and (closed or now - failing_since >= self.lost_after):
                    reported = True
                    _log.warning("event subscription interrupted for %.1f s: %s",
                                 now - failing_since, exc)
                    if self._on_error is not None:
                        try:
                            self._on_error(exc)
                        except Exception:  # noqa: BLE001 - user code must not kill the thread
                            _log.exception("subscription on_error callback failed")
                self._stop.wait(0.5)
                continue
            if not isinstance(items, list):
                continue
            for item in items:
                try:
                    event = Event.from_wire(item)
                except EventSchemaError:
                    _log.warning("discarding a malformed event record")
                    continue
                if event.seq <= self.last_seq:
                    continue
                self.last_seq = event.seq
                if self._stop.is_set():
                    break
                try:
                    self._callback(event.topic, {**event.payload, "seq": event.seq})
                except Exception:  # noqa: BLE001 - user code must not kill the thread
                    _log.exception("event callback failed on %s #%d", event.topic, event.seq)
        if channel is not None:
            client._discard_channel(channel)


def heartbeat_budget(interval: float) -> float:
    """How long one heartbeat every ``interval`` seconds waits for the server's answer (a
    server that cannot answer within that is failing the member's heartbeats)."""
    return max(4 * interval, 1.0)


class _Heartbeat:
    def __init__(self, client: ControlClient, member: str, interval: float,
                 limit: float | None, info: dict[str, Any] | None) -> None:
        self.member = member
        self._client = client
        self.interval = interval
        self._fields: dict[str, Any] = {"member": member}
        if limit is not None:
            self._fields["limit"] = limit
        if info:
            self._fields["info"] = info
        self._stop = threading.Event()
        #: the last beat went unanswered (set and cleared by the heartbeat thread only)
        self.failing = False
        self._thread = threading.Thread(target=self._run, name=f"torchcomms-heartbeat-{member}",
                                        daemon=True)

    def beat_once(self, budget: float | None = None) -> None:
        self._client._call("heartbeat", self._fields,
                           budget=self._client.timeout if budget is None else budget)

    @property
    def beat_budget(self) -> float:
        """How long one beat waits for the server's answer."""
        return heartbeat_budget(self.interval)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(2.0)

    def _run(self) -> None:
        client = self._client
        channel: _Channel | None = None
        while not self._stop.wait(self.interval):
            try:
                if channel is None:
                    channel = client._new_channel()
                client._call("heartbeat", self._fields, budget=self.beat_budget,
                             channel=channel, stop=self._stop)
                self.failing = False
            except ControlClosedError:
                break
            except ControlError as exc:
                if channel is not None:
                    client._discard_channel(channel)
                    channel = None
                if not self.failing:
                    self.failing = True
                    _log.warning("heartbeat for %s failed: %s", self.member, exc)
        if channel is not None:
            client._discard_channel(channel)


class ControlClient:
    """Client of a :class:`~torchcomms.control.server.StoreServer` (thread-safe).

    ``addr`` is ``tcp://host:port``; ``secret`` the per-job secret; ``timeout`` (seconds) the
    default deadline of every call, also the default wait of ``get``/``wait``.
    """

    def __init__(self, addr: str, secret: bytes, *, timeout: float | timedelta = DEFAULT_TIMEOUT_S,
                 limits: Limits | None = None) -> None:
        self.address = _check_address(addr)
        self._keys = derive_keys(secret)
        self._timeout = _seconds(timeout, "timeout", allow_none=False)
        self.limits = limits or Limits()
        self._ctx = zmq.Context()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._idle: list[_Channel] = []
        self._channels: set[_Channel] = set()
        self._active_calls = 0
        self._closed = False
        self._subscriptions: set[Subscription] = set()
        self._heartbeats: dict[str, _Heartbeat] = {}
        self._cancelled: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
        self._pid = os.getpid()

    # ------------------------------------------------------------------ plumbing

    @property
    def timeout(self) -> float:
        """Default deadline (seconds) of every call."""
        return self._timeout  # type: ignore[return-value]

    @timeout.setter
    def timeout(self, value: float | timedelta) -> None:
        self._timeout = _seconds(value, "timeout", allow_none=False)

    @property
    def closed(self) -> bool:
        return self._closed

    def cancel_calls_of(self, thread: threading.Thread) -> None:
        """Fail the call ``thread`` is blocked in (within ~0.1 s) and every later one it makes
        through this client with :class:`ControlCancelledError`: for a thread whose caller gave
        up on it (an engine's rendezvous abandoned at its deadline, say), so that it ends
        instead of waiting on a server that does not answer. Other threads are not affected."""
        with self._lock:
            self._cancelled.add(thread)

    def _cancelled_here(self) -> bool:
        return bool(self._cancelled) and threading.current_thread() in self._cancelled

    def _new_channel(self) -> _Channel:
        with self._lock:
            if self._closed:
                raise ControlClosedError(f"control client for {self.address} is closed")
            channel = _Channel(self._ctx, self.address, self._keys, min(self.timeout, 10.0))
            self._channels.add(channel)
        return channel

    def _acquire(self) -> _Channel:
        with self._lock:
            if self._closed:
                raise ControlClosedError(f"control client for {self.address} is closed")
            if self._idle:
                return self._idle.pop()
        return self._new_channel()

    def _release(self, channel: _Channel) -> None:
        with self._lock:
            if not self._closed and channel in self._channels:
                self._idle.append(channel)
                return
        self._discard_channel(channel)

    def _discard_channel(self, channel: _Channel) -> None:
        with self._lock:
            if channel not in self._channels:
                return
            self._channels.discard(channel)
            channel.close()

    def _call(self, op: str, fields: dict[str, Any], *, budget: float,
              channel: _Channel | None = None, stop: threading.Event | None = None) -> Any:
        """Send one request and wait (at most ``budget`` seconds) for its reply's value."""
        if self._closed:
            raise ControlClosedError(f"control client for {self.address} is closed")
        if os.getpid() != self._pid:
            raise ControlUnavailableError(
                "this ControlClient was created in another process (fork); create a new one")
        if self._cancelled_here():
            raise ControlCancelledError(f"{op}: this thread's calls to {self.address} were cancelled")
        request_id = next(self._ids)
        frame = proto.encode({"id": request_id, "op": op, **fields})
        if len(frame) > self.limits.max_message_bytes:
            raise ControlArgumentError(
                f"{op}: request is {len(frame)} bytes; the message limit is "
                f"{self.limits.max_message_bytes} bytes")
        with self._lock:  # counted under the lock, so close() waits for this call
            if self._closed:
                raise ControlClosedError(f"control client for {self.address} is closed")
            self._active_calls += 1
        owned = channel is None
        chan: _Channel | None = channel
        healthy = False
        try:
            if chan is None:
                chan = self._acquire()
            reply = self._exchange(chan, op, request_id, frame, budget, stop)
            healthy = True
        except zmq.ZMQError as exc:
            if self._closed:
                raise ControlClosedError(
                    f"{op}: control client for {self.address} was closed") from None
            raise ControlUnavailableError(
                f"{op}: socket error talking to the control server at {self.address}: {exc}"
            ) from exc
        finally:
            with self._lock:
                self._active_calls -= 1
            if owned and chan is not None:
                if healthy:
                    self._release(chan)
                else:
                    self._discard_channel(chan)
        if not reply.ok:
            raise proto.error_from_reply(reply, f"control {op} failed")
        return reply.value

    def _exchange(self, chan: _Channel, op: str, request_id: int, frame: bytes, budget: float,
                  stop: threading.Event | None) -> proto.Reply:
        # Monitor events that arrived while the channel was idle are seen by the poll below;
        # here only what earlier calls already learnt is checked (no extra socket call).
        if chan.watch.auth_failure is not None:
            raise chan.watch.auth_failure
        if chan.watch.lost:
            raise ControlUnavailableError(
                f"{op}: the connection to the control server at {self.address} was lost")
        deadline = time.monotonic() + budget
        try:
            chan.sock.send(frame, zmq.NOBLOCK, copy=len(frame) < 65536)
        except zmq.Again:
            raise ControlUnavailableError(
                f"{op}: cannot queue a request to the control server at {self.address}") from None
        while True:
            if self._closed or (stop is not None and stop.is_set()):
                raise ControlClosedError(f"{op}: control client for {self.address} was closed")
            if self._cancelled_here():
                raise ControlCancelledError(f"{op}: this thread's calls to {self.address} were cancelled")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                chan.drain_monitor()
                if chan.watch.auth_failure is not None:
                    raise chan.watch.auth_failure
                if chan.watch.unanswered or (chan.watch.connected and not chan.watch.established):
                    raise ControlHandshakeTimeoutError(
                        f"{op}: connected to {self.address}, but the CURVE handshake was not "
                        f"answered within {budget:.1f} s: the server is stopped or hung (the "
                        "kernel still accepts connections for it), or the peer is not a "
                        "torchcomms control server")
                if not chan.watch.ever_established:
                    raise ControlUnavailableError(
                        f"{op}: could not reach the control server at {self.address} "
                        f"within {budget:.1f} s")
                raise ControlUnavailableError(
                    f"{op}: no reply from the control server at {self.address} "
                    f"within {budget:.1f} s")
            ready = dict(chan.poller.poll(int(min(remaining, _POLL_SLICE_S) * 1000) + 1))
            if chan.sock in ready:
                reply = proto.decode_reply(chan.sock.recv(), self.limits)
                if reply.id == request_id:
                    return reply
                if reply.id is None and not reply.ok:
                    raise proto.error_from_reply(reply, f"control {op} rejected")
                continue  # a stale reply of an abandoned request
            if chan.monitor in ready:
                chan.drain_monitor()
                if chan.watch.auth_failure is not None:
                    raise chan.watch.auth_failure
                if chan.watch.lost:
                    raise ControlUnavailableError(
                        f"{op}: the control server at {self.address} closed the connection")

    def _key(self, key: Any, name: str = "key") -> str:
        if not isinstance(key, str):
            raise ControlArgumentTypeError(f"{name} must be a str, got {type(key).__name__}")
        try:
            return proto.check_key(name, key, self.limits)
        except ProtocolViolation as exc:
            raise ControlArgumentError(exc.message) from None

    def _key_list(self, keys: Any, name: str = "keys") -> list[str]:
        if isinstance(keys, str):
            return [self._key(keys, name)]
        if not isinstance(keys, (list, tuple)):
            raise ControlArgumentTypeError(
                f"{name} must be a list of str, got {type(keys).__name__}")
        if len(keys) > self.limits.max_keys_per_request:
            raise ControlArgumentError(f"{name} has {len(keys)} keys; the limit is "
                                       f"{self.limits.max_keys_per_request}")
        return [self._key(k, f"{name}[{i}]") for i, k in enumerate(keys)]

    def _value(self, value: Any, name: str = "value") -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise ControlArgumentTypeError(
                f"{name} must be bytes, got {type(value).__name__}")
        raw = bytes(value)
        if len(raw) > self.limits.max_value_bytes:
            raise ControlArgumentError(f"{name} is {len(raw)} bytes; the value limit is "
                                       f"{self.limits.max_value_bytes} bytes")
        return raw

    def _wait_budget(self, timeout: Any) -> tuple[float, float]:
        wait = _seconds(timeout, "timeout")
        wait = self.timeout if wait is None else min(wait, proto.MAX_TIMEOUT_S)
        return wait, wait + _REPLY_GRACE_S

    # ------------------------------------------------------------------ key-value API

    def hello(self, timeout: float | timedelta | None = None) -> dict[str, Any]:
        """Handshake with the server (within ``timeout``, default the client's); returns its
        protocol version, run id, limits and the last event's sequence number."""
        budget = _seconds(timeout, "timeout")
        info = self._call("hello", {}, budget=self.timeout if budget is None else budget)
        if not isinstance(info, dict):
            raise ControlProtocolError("malformed hello reply from the control server")
        return info

    def ping(self, timeout: float | timedelta | None = None) -> float:
        """Round-trip one request (within ``timeout``, default the client's); returns the
        latency in seconds."""
        budget = self.timeout if timeout is None else _seconds(timeout, "timeout")
        start = time.perf_counter()
        self._call("ping", {}, budget=budget or 0.0)
        return time.perf_counter() - start

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (wakes everyone waiting for it)."""
        self._call("set", {"key": self._key(key), "value": self._value(value)},
                   budget=self.timeout)

    def get(self, key: str, timeout: float | timedelta | None = None) -> bytes:
        """Return the value of ``key``, waiting up to ``timeout`` for it to be set."""
        wait, budget = self._wait_budget(timeout)
        value = self._call("get", {"key": self._key(key), "timeout": wait}, budget=budget)
        if not isinstance(value, bytes):
            raise ControlProtocolError("malformed get reply from the control server")
        return value

    def add(self, key: str, delta: int) -> int:
        """Atomically add ``delta`` to the integer under ``key`` (0 if absent); returns it."""
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise ControlArgumentTypeError(f"delta must be an int, got {type(delta).__name__}")
        if not proto.INT64_MIN <= delta <= proto.INT64_MAX:
            raise ControlArgumentError(f"delta {delta} is outside the int64 range")
        value = self._call("add", {"key": self._key(key), "delta": delta}, budget=self.timeout)
        return int(value)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is absent and ``expected``
        is empty); returns the value the key holds afterwards (c10d semantics)."""
        value = self._call("compare_set", {"key": self._key(key),
                                           "expected": self._value(expected, "expected"),
                                           "desired": self._value(desired, "desired")},
                           budget=self.timeout)
        return bytes(value)

    def delete(self, key: str) -> bool:
        """Delete ``key``; returns whether it existed."""
        return bool(self._call("delete", {"key": self._key(key)}, budget=self.timeout))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with ``prefix``; returns how many were deleted."""
        return int(self._call("delete_prefix", {"prefix": self._prefix(prefix)},
                              budget=self.timeout))

    def check(self, keys: str | Iterable[str]) -> bool:
        """Whether all ``keys`` are present (does not wait)."""
        return bool(self._call("check", {"keys": self._key_list(keys)}, budget=self.timeout))

    def wait(self, keys: str | Iterable[str], timeout: float | timedelta | None = None) -> None:
        """Block until all ``keys`` are present; :class:`ControlTimeoutError` after
        ``timeout`` seconds (default: the client's timeout) names the missing ones."""
        wait, budget = self._wait_budget(timeout)
        self._call("wait", {"keys": self._key_list(keys), "timeout": wait}, budget=budget)

    def keys(self, prefix: str = "") -> list[str]:
        """All keys starting with ``prefix``, sorted."""
        value = self._call("keys", {"prefix": self._prefix(prefix)}, budget=self.timeout)
        return list(value)

    def num_keys(self) -> int:
        """Number of keys in the store (event records under ``events/`` included)."""
        return int(self._call("num_keys", {}, budget=self.timeout))

    def append(self, key: str, value: bytes) -> None:
        """Append ``value`` to the bytes under ``key`` (creating it if absent)."""
        self._call("append", {"key": self._key(key), "value": self._value(value)},
                   budget=self.timeout)

    def multi_get(self, keys: Iterable[str], timeout: float | timedelta | None = None
                  ) -> list[bytes]:
        """Values of all ``keys``, waiting up to ``timeout`` for all of them."""
        wait, budget = self._wait_budget(timeout)
        return list(self._call("multi_get", {"keys": self._key_list(keys), "timeout": wait},
                               budget=budget))

    def multi_set(self, keys: Iterable[str], values: Iterable[bytes]) -> None:
        """Set several keys in one request."""
        key_list = self._key_list(list(keys) if not isinstance(keys, str) else keys)
        value_list = [self._value(v, f"values[{i}]") for i, v in enumerate(values)]
        if len(key_list) != len(value_list):
            raise ControlArgumentError(
                f"multi_set: {len(key_list)} keys but {len(value_list)} values")
        self._call("multi_set", {"keys": key_list, "values": value_list}, budget=self.timeout)

    def queue_push(self, key: str, value: bytes) -> None:
        """Push ``value`` to the back of the queue ``key``."""
        self._call("queue_push", {"key": self._key(key), "value": self._value(value)},
                   budget=self.timeout)

    def queue_pop(self, key: str, block: bool = True,
                  timeout: float | timedelta | None = None) -> bytes:
        """Pop the front of the queue ``key``; waits up to ``timeout`` when ``block``."""
        if not isinstance(block, bool):
            raise ControlArgumentTypeError(f"block must be a bool, got {type(block).__name__}")
        wait, budget = self._wait_budget(timeout)
        return bytes(self._call("queue_pop", {"key": self._key(key), "block": block,
                                              "timeout": wait}, budget=budget))

    def queue_len(self, key: str) -> int:
        """Number of items in the queue ``key``."""
        return int(self._call("queue_len", {"key": self._key(key)}, budget=self.timeout))

    def _prefix(self, prefix: Any) -> str:
        if not isinstance(prefix, str):
            raise ControlArgumentTypeError(f"prefix must be a str, got {type(prefix).__name__}")
        try:
            return proto.check_key("prefix", prefix, self.limits, allow_empty=True)
        except ProtocolViolation as exc:
            raise ControlArgumentError(exc.message) from None

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
        return int(self._call("publish", {"topic": topic, "payload": payload},
                              budget=self.timeout))

    def events(self, since: int = 0, topics: str | Iterable[str] | None = None,
               timeout: float | timedelta | None = 0.0) -> list[tuple[int, str, dict[str, Any]]]:
        """Events after sequence number ``since`` as ``(seq, topic, payload)``; with a
        ``timeout`` > 0 waits that long for at least one."""
        if isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise ControlArgumentError(f"since must be an int >= 0, got {since!r}")
        wait, budget = self._wait_budget(timeout)
        fields: dict[str, Any] = {"since": since, "timeout": wait}
        topic_list = self._topics(topics)
        if topic_list is not None:
            fields["topics"] = topic_list
        items = self._call("events", fields, budget=budget)
        out = []
        for item in items:
            event = Event.from_wire(item)
            out.append((event.seq, event.topic, event.payload))
        return out

    @staticmethod
    def _topics(topics: Any) -> list[str] | None:
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
        on a starved box is retried, not reported); delivery resumes, without gaps, once the
        same server answers again (a restarted server starts a new history)."""
        if not callable(callback):
            raise ControlArgumentTypeError("callback must be callable")
        if since is None:
            since = int(self.hello()["last_event_seq"])
        elif isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise ControlArgumentError(f"since must be an int >= 0 or None, got {since!r}")
        topic_list = self._topics(topics)
        with self._lock:
            if self._closed:
                raise ControlClosedError(f"control client for {self.address} is closed")
        if lost_after is None:
            lost_after = settings().control_lost_s
        patience = _seconds(lost_after, "lost_after", allow_none=False)
        assert patience is not None
        subscription = Subscription(self, topic_list, callback, since, on_error, patience)
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
        first_budget = _seconds(timeout, "timeout")
        if not isinstance(member, str) or not member or len(member) > proto.MAX_NAME_CHARS:
            raise ControlArgumentError(f"member must be a non-empty str of at most "
                                       f"{proto.MAX_NAME_CHARS} characters, got {member!r}")
        if interval is None:
            interval = settings().heartbeat_s
        beat = _seconds(interval, "interval", allow_none=False)
        assert beat is not None
        if beat <= 0:
            raise ControlArgumentError("interval must be > 0 seconds")
        if limit is None and settings().source("TORCHCOMM_HEARTBEAT_LIMIT_S"):
            limit = settings().heartbeat_limit_s  # else the server's own limit
        silence = _seconds(limit, "limit")
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
        heartbeat = _Heartbeat(self, member, beat, silence, info)
        heartbeat.beat_once(first_budget)
        with self._lock:
            self._heartbeats[member] = heartbeat
        heartbeat.start()

    def heartbeat_stop(self, member: str | None = None, *,
                       timeout: float | timedelta | None = None) -> None:
        """Stop heartbeats (of ``member``, or all) and deregister them from the server, so
        that a clean exit is not reported as a failure (``timeout``: for the deregistration,
        default the client's, at most 5 s). A heartbeat whose last beat went unanswered is
        deregistered within one heartbeat interval instead: its server is stopped, hung or
        gone, and an exit must not wait the whole timeout on it."""
        budget = _seconds(timeout, "timeout")
        budget = min(self.timeout, 5.0) if budget is None else budget
        with self._lock:
            names = list(self._heartbeats) if member is None else [member]
            stopping = [self._heartbeats.pop(n) for n in names if n in self._heartbeats]
        if member is not None and not stopping:
            raise ControlArgumentError(f"no heartbeats are running for {member!r}")
        for heartbeat in stopping:
            heartbeat.stop()
            wait = min(budget, heartbeat.interval) if heartbeat.failing else budget
            self._call("heartbeat_stop", {"member": heartbeat.member}, budget=wait)

    def heartbeat_forget(self, member: str, *, timeout: float | timedelta | None = None) -> bool:
        """Deregister ``member``, whoever sent its heartbeats (a supervisor forgetting a
        worker that exited, so its silence is not reported later). Returns whether the server
        knew it."""
        if not isinstance(member, str) or not member or len(member) > proto.MAX_NAME_CHARS:
            raise ControlArgumentError(f"member must be a non-empty str of at most "
                                       f"{proto.MAX_NAME_CHARS} characters, got {member!r}")
        budget = _seconds(timeout, "timeout")
        return bool(self._call("heartbeat_stop", {"member": member},
                               budget=self.timeout if budget is None else budget))

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop heartbeats (deregistering them) and subscriptions, close the sockets.
        Calls blocked in other threads raise :class:`ControlClosedError`. Idempotent."""
        if self._closed:
            return
        try:
            self.heartbeat_stop(timeout=1.0)
        except ControlError as exc:
            _log.debug("could not deregister heartbeats on close: %s", exc)
        with self._lock:
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            subscription.close()
        with self._lock:
            self._closed = True
        deadline = time.monotonic() + 1.0
        while self._active_calls and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._lock:
            for channel in self._channels:
                channel.close()
            self._channels.clear()
            self._idle.clear()
        if os.getpid() == self._pid:
            self._ctx.destroy(linger=0)

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"ControlClient({self.address!r}, timeout={self.timeout}, {state})"

    def __reduce__(self) -> Any:
        raise TypeError("ControlClient cannot be pickled: pass the address and secret instead")
