"""The control-plane store server: a key-value store, an event bus and heartbeat tracking.

One :class:`StoreServer` per job, hosted by the launcher agent (or ``python -m
torchcomms.control``). A single thread owns the ZeroMQ ROUTER socket and all state, so the
store needs no locks; blocking requests (``get``, ``wait``, ``multi_get``, ``queue_pop``,
``events``) are parked with a deadline and answered when their keys arrive or the deadline
passes. The event bus is long-polling over the same socket: subscribers ask for "events after
seq N", which also makes replay for late subscribers exact. Members that send heartbeats and
then go silent for longer than their limit are reported on the bus (``rank_failed`` with
``reason="heartbeat"`` for ``rank/<n>``, ``node_lost`` for ``node/<n>``).

Under a supervisor that judges its ranks itself (the launcher's agent, which sees their
processes), a silent ``rank/<n>`` is only a suspicion: with ``rank_silence="suspect"`` the
server publishes ``rank_silent`` when the rank goes quiet and ``rank_heard`` when it beats
again, and the agent decides (see ``launcher/liveness.py``). A silent heartbeat alone never
tells slow from dead: a starved box or a C call holding the GIL silences a healthy rank.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import zmq

from . import protocol as proto
from .auth import ServerAuthenticator, configure_server_socket
from torchcomms.config import settings
from .errors import ControlArgumentError, ControlClosedError, ControlError, ControlUnavailableError
from .events import (
    MEMBER_LOST,
    NODE_LOST,
    RANK_FAILED,
    RANK_HEARD,
    RANK_SILENT,
    Event,
    EventSchemaError,
    event_key,
    validate_event,
)
from .protocol import Limits, ProtocolViolation, Request
from .secrets import derive_keys, load_secret

__all__ = ["StoreServer", "DEFAULT_HEARTBEAT_LIMIT_S"]

DEFAULT_HEARTBEAT_LIMIT_S = 1.5
_HEARTBEAT_CHECK_S = 0.05
_MAX_EVENTS_PER_REPLY = 1000
_log = logging.getLogger("torchcomms.control.server")


@dataclass(eq=False)
class _Waiter:
    identity: bytes
    request_id: int
    op: str
    keys: list[str]
    deadline: float
    started: float
    args: dict[str, Any] = field(default_factory=dict)
    done: bool = False


@dataclass
class _Member:
    limit: float
    last_seen: float
    info: dict[str, Any]
    silent: bool = False  # reported ``rank_silent`` and not heard since


class StoreServer:
    """The job's control-plane server.

    ``secret`` is the per-job secret (bytes); ``None`` reads it from the environment
    (:func:`~torchcomms.control.secrets.load_secret`). ``heartbeat_limit`` is how long a
    member may stay silent before it is reported lost (members may ask for their own).
    ``rank_silence`` is ``"failed"`` (a silent ``rank/<n>`` is published as ``rank_failed``)
    or ``"suspect"`` (published as ``rank_silent``, then ``rank_heard`` if it beats again:
    a supervisor that sees the rank's process decides whether it failed).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: bytes | None = None,
        *,
        heartbeat_limit: float = DEFAULT_HEARTBEAT_LIMIT_S,
        run_id: str | None = None,
        limits: Limits | None = None,
        max_pending: int = 100_000,
        max_events: int = 100_000,
        rank_silence: str = "failed",
    ) -> None:
        if not isinstance(host, str) or not host:
            raise ControlArgumentError(f"host must be a non-empty str, got {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ControlArgumentError(f"port must be an int in [0, 65535], got {port!r}")
        if isinstance(heartbeat_limit, bool) or not isinstance(heartbeat_limit, (int, float)) \
                or not heartbeat_limit > 0:
            raise ControlArgumentError(
                f"heartbeat_limit must be a positive number of seconds, got {heartbeat_limit!r}")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending <= 0:
            raise ControlArgumentError(f"max_pending must be a positive int, got {max_pending!r}")
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events <= 0:
            raise ControlArgumentError(f"max_events must be a positive int, got {max_events!r}")
        self._keys = derive_keys(load_secret() if secret is None else secret)
        self._host = host
        self._port = port
        if rank_silence not in ("failed", "suspect"):
            raise ControlArgumentError(
                f"rank_silence must be 'failed' or 'suspect', got {rank_silence!r}")
        self.heartbeat_limit = float(heartbeat_limit)
        self.rank_silence = rank_silence
        self.run_id = run_id if run_id is not None else (
            settings().run_id or settings().torchelastic_run_id or "")
        self.limits = limits or Limits()
        self._max_pending = max_pending
        self._max_events = max_events

        self._ctx: zmq.Context | None = None
        self._auth: ServerAuthenticator | None = None
        self._router: zmq.Socket | None = None
        self._wake_recv: zmq.Socket | None = None
        self._wake_send: zmq.Socket | None = None
        self._wake_lock = threading.Lock()
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = \
            queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._address: str | None = None
        self._started = threading.Event()

        # State below is touched by the server thread only.
        self._data: dict[str, bytes] = {}
        self._queues: dict[str, deque[bytes]] = {}
        self._waiters_by_key: dict[str, list[_Waiter]] = {}
        self._queue_waiters: dict[str, deque[_Waiter]] = {}
        self._event_waiters: list[_Waiter] = []
        self._deadlines: list[tuple[float, int, _Waiter]] = []
        self._tiebreak = itertools.count()
        self._pending = 0
        self._events: deque[Event] = deque()
        self._next_seq = 1
        self._members: dict[str, _Member] = {}
        self._next_heartbeat_check = 0.0
        self.stats: dict[str, int] = {"requests": 0, "errors": 0, "events": 0}

    # ------------------------------------------------------------------ lifecycle

    @property
    def address(self) -> str:
        """``tcp://host:port`` clients connect to (valid after :meth:`start`)."""
        if self._address is None:
            raise ControlUnavailableError("the control server is not started")
        return self._address

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def start(self) -> StoreServer:
        """Bind and start serving in background threads; returns ``self``."""
        if self._thread is not None:
            raise ControlError("the control server was already started")
        ctx = zmq.Context()
        self._ctx = ctx
        try:
            self._auth = ServerAuthenticator(ctx, self._keys)
            self._auth.start()
            router = ctx.socket(zmq.ROUTER)
            router.linger = 200
            router.setsockopt(zmq.MAXMSGSIZE, self.limits.hard_message_bytes)
            router.setsockopt(zmq.SNDHWM, 10_000)
            router.setsockopt(zmq.RCVHWM, 10_000)
            router.setsockopt(zmq.TCP_KEEPALIVE, 1)
            router.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 30)
            router.setsockopt(zmq.HEARTBEAT_IVL, 2000)
            router.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10_000)
            if ":" in self._host:
                router.setsockopt(zmq.IPV6, 1)
            configure_server_socket(router, self._keys)
            bind_host = f"[{self._host}]" if ":" in self._host else self._host
            try:
                router.bind(f"tcp://{bind_host}:{self._port or '*'}")
            except zmq.ZMQError as exc:
                router.close(0)
                raise ControlUnavailableError(
                    f"control server cannot bind tcp://{bind_host}:{self._port}: {exc}") from exc
            self._router = router
            endpoint = router.getsockopt(zmq.LAST_ENDPOINT).decode()
            port = int(endpoint.rsplit(":", 1)[1])
            advertised = self._host
            if advertised in ("0.0.0.0", "::", "*"):
                advertised = socket.gethostname()
            advertised = f"[{advertised}]" if ":" in advertised else advertised
            self._address = f"tcp://{advertised}:{port}"
            wake_addr = f"inproc://torchcomms-control-wake-{id(self)}"
            self._wake_recv = ctx.socket(zmq.PULL)
            self._wake_recv.bind(wake_addr)
            self._wake_send = ctx.socket(zmq.PUSH)
            self._wake_send.linger = 0
            self._wake_send.connect(wake_addr)
        except BaseException:
            self._teardown()
            raise
        self._thread = threading.Thread(target=self._serve, name="torchcomms-control-server",
                                        daemon=True)
        self._thread.start()
        self._started.set()
        _log.info("control server listening on %s", self._address)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: parked requests get an ``unavailable`` error; idempotent."""
        if self._thread is None or self._stopping:
            if self._thread is not None:
                self._thread.join(timeout)
            return
        self._stopping = True
        self._wake()
        self._thread.join(timeout)
        self._teardown()

    def _teardown(self) -> None:
        for sock in (self._router, self._wake_recv, self._wake_send):
            if sock is not None and not sock.closed:
                sock.close()
        if self._auth is not None:
            self._auth.stop()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def __enter__(self) -> StoreServer:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def refused_handshakes(self) -> int:
        """Number of client handshakes the authenticator refused."""
        return self._auth.refused if self._auth is not None else 0

    # ------------------------------------------------------------------ in-process API

    def publish(self, topic: str, payload: dict[str, Any], timeout: float = 10.0) -> int:
        """Publish an event from this process (thread-safe); returns its sequence number."""
        payload = dict(payload)
        try:
            validate_event(topic, payload)
            proto.check_payload(payload, self.limits)
        except (EventSchemaError, ProtocolViolation) as exc:
            raise ControlArgumentError(f"cannot publish {topic!r}: {exc}") from None
        return self._run_in_loop(lambda: self._publish(topic, payload).seq, timeout)

    def _run_in_loop(self, fn: Callable[[], Any], timeout: float) -> Any:
        if self._thread is None or self._stopping or not self._thread.is_alive():
            raise ControlClosedError("the control server is not running")
        future: Future[Any] = Future()
        self._commands.put((fn, future))
        self._wake()
        return future.result(timeout)

    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_send is not None and not self._wake_send.closed:
                try:
                    self._wake_send.send(b"", zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass

    # ------------------------------------------------------------------ serving loop

    def _serve(self) -> None:
        assert self._router is not None and self._wake_recv is not None
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_recv, zmq.POLLIN)
        while not self._stopping:
            try:
                events = dict(poller.poll(self._poll_timeout_ms()))
                if self._wake_recv in events:
                    self._drain_commands()
                if self._router in events:
                    self._drain_requests()
                now = time.monotonic()
                self._expire_waiters(now)
                self._check_heartbeats(now)
            except Exception:  # noqa: BLE001 - the server must keep serving
                _log.exception("control server loop error (continuing)")
        self._fail_all_waiters("the control server is stopping")
        self._drain_commands()

    def _poll_timeout_ms(self) -> int:
        now = time.monotonic()
        wake = now + 1.0
        if self._deadlines:
            wake = min(wake, self._deadlines[0][0])
        if self._members:
            wake = min(wake, self._next_heartbeat_check)
        return max(0, int((wake - now) * 1000) + 1)

    def _drain_commands(self) -> None:
        assert self._wake_recv is not None
        while True:
            try:
                self._wake_recv.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if self._stopping:
                future.set_exception(ControlClosedError("the control server is stopping"))
                continue
            try:
                future.set_result(fn())
            except Exception as exc:  # noqa: BLE001 - handed back to the caller
                future.set_exception(exc)

    def _drain_requests(self) -> None:
        assert self._router is not None
        router = self._router
        for index in range(1000):  # bounded, so timers and commands still get their turn
            # the poll said the first one is there; after it, checking EVENTS is much
            # cheaper than a recv that raises zmq.Again
            if index and not router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                return
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity = frames[0]
            self.stats["requests"] += 1
            if len(frames) != 2:
                self._send_error(identity, None, "protocol",
                                 f"expected one message frame, got {len(frames) - 1}")
                continue
            try:
                request = proto.decode_request(frames[1], self.limits)
            except ProtocolViolation as exc:
                self._send_error(identity, exc.request_id, exc.code, exc.message)
                continue
            try:
                self._handle(identity, request)
            except ProtocolViolation as exc:
                self._send_error(identity, request.id, exc.code, exc.message)
            except Exception as exc:  # noqa: BLE001 - never crash on one request
                _log.exception("control server failed on op %r", request.op)
                self._send_error(identity, request.id, "internal",
                                 f"internal error on op {request.op!r}: {type(exc).__name__}")

    def _send(self, identity: bytes, payload: bytes) -> None:
        assert self._router is not None
        try:
            self._router.send(identity, zmq.NOBLOCK | zmq.SNDMORE)
            self._router.send(payload, zmq.NOBLOCK, copy=len(payload) < 65536)
        except zmq.ZMQError:
            pass  # the peer is gone or not draining; drop the reply

    def _send_ok(self, identity: bytes, request_id: int, value: Any = None) -> None:
        self._send(identity, proto.encode_ok(request_id, value))

    def _send_error(self, identity: bytes, request_id: int | None, code: str, message: str,
                    keys: list[str] | None = None) -> None:
        self.stats["errors"] += 1
        self._send(identity, proto.encode_error(request_id, code, message, keys))

    # ------------------------------------------------------------------ ops

    def _handle(self, identity: bytes, req: Request) -> None:
        handler = getattr(self, f"_op_{req.op}")
        handler(identity, req)

    def _op_hello(self, identity: bytes, req: Request) -> None:
        self._send_ok(identity, req.id, {
            "version": proto.PROTOCOL_VERSION,
            "run_id": self.run_id,
            "heartbeat_limit": self.heartbeat_limit,
            "max_key_bytes": self.limits.max_key_bytes,
            "max_value_bytes": self.limits.max_value_bytes,
            "max_message_bytes": self.limits.max_message_bytes,
            "last_event_seq": self._next_seq - 1,
        })

    def _op_ping(self, identity: bytes, req: Request) -> None:
        self._send_ok(identity, req.id, "pong")

    def _op_set(self, identity: bytes, req: Request) -> None:
        self._put(req.args["key"], req.args["value"])
        self._send_ok(identity, req.id)

    def _op_multi_set(self, identity: bytes, req: Request) -> None:
        for key, value in zip(req.args["keys"], req.args["values"]):
            self._put(key, value)
        self._send_ok(identity, req.id)

    def _op_get(self, identity: bytes, req: Request) -> None:
        self._get_or_park(identity, req, [req.args["key"]])

    def _op_multi_get(self, identity: bytes, req: Request) -> None:
        self._get_or_park(identity, req, req.args["keys"])

    def _op_wait(self, identity: bytes, req: Request) -> None:
        self._get_or_park(identity, req, req.args["keys"])

    def _op_add(self, identity: bytes, req: Request) -> None:
        key, delta = req.args["key"], req.args["delta"]
        current = self._data.get(key)
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
        self._put(key, str(result).encode("ascii"))
        self._send_ok(identity, req.id, result)

    def _op_compare_set(self, identity: bytes, req: Request) -> None:
        key, expected, desired = req.args["key"], req.args["expected"], req.args["desired"]
        current = self._data.get(key)
        if current is None:
            if expected == b"":
                self._put(key, desired)
                result = desired
            else:
                result = expected
        elif current == expected:
            self._put(key, desired)
            result = desired
        else:
            result = current
        self._send_ok(identity, req.id, result)

    def _op_append(self, identity: bytes, req: Request) -> None:
        key, value = req.args["key"], req.args["value"]
        current = self._data.get(key, b"")
        if len(current) + len(value) > self.limits.max_value_bytes:
            raise ProtocolViolation("limit", f"append: key {key!r} would exceed the value limit "
                                             f"of {self.limits.max_value_bytes} bytes")
        self._put(key, current + value)
        self._send_ok(identity, req.id)

    def _op_delete(self, identity: bytes, req: Request) -> None:
        existed = self._data.pop(req.args["key"], None) is not None
        self._send_ok(identity, req.id, existed)

    def _op_delete_prefix(self, identity: bytes, req: Request) -> None:
        prefix = req.args["prefix"]
        doomed = [key for key in self._data if key.startswith(prefix)]
        for key in doomed:
            del self._data[key]
        self._send_ok(identity, req.id, len(doomed))

    def _op_check(self, identity: bytes, req: Request) -> None:
        self._send_ok(identity, req.id, all(key in self._data for key in req.args["keys"]))

    def _op_keys(self, identity: bytes, req: Request) -> None:
        prefix = req.args["prefix"]
        self._send_ok(identity, req.id, sorted(k for k in self._data if k.startswith(prefix)))

    def _op_num_keys(self, identity: bytes, req: Request) -> None:
        self._send_ok(identity, req.id, len(self._data))

    def _op_queue_push(self, identity: bytes, req: Request) -> None:
        key = req.args["key"]
        self._queues.setdefault(key, deque()).append(req.args["value"])
        self._send_ok(identity, req.id)
        self._serve_queue(key)

    def _op_queue_pop(self, identity: bytes, req: Request) -> None:
        key = req.args["key"]
        items = self._queues.get(key)
        if items:
            self._send_ok(identity, req.id, self._pop_queue(key))
            return
        if not req.args.get("block", True) or req.args.get("timeout") == 0:
            raise ProtocolViolation("timeout", f"queue_pop: queue {key!r} is empty")
        waiter = self._park(identity, req, [key])
        self._queue_waiters.setdefault(key, deque()).append(waiter)

    def _op_queue_len(self, identity: bytes, req: Request) -> None:
        self._send_ok(identity, req.id, len(self._queues.get(req.args["key"], ())))

    def _op_publish(self, identity: bytes, req: Request) -> None:
        topic, payload = req.args["topic"], req.args["payload"]
        try:
            validate_event(topic, payload)
        except EventSchemaError as exc:
            raise ProtocolViolation("protocol", f"publish: {exc}") from None
        event = self._publish(topic, payload)
        self._send_ok(identity, req.id, event.seq)

    def _op_events(self, identity: bytes, req: Request) -> None:
        since, topics = req.args["since"], req.args.get("topics")
        found = self._events_after(since, topics)
        if found or req.args.get("timeout") == 0:
            self._send_ok(identity, req.id, [e.to_wire() for e in found])
            return
        waiter = self._park(identity, req, [])
        self._event_waiters.append(waiter)

    def _op_heartbeat(self, identity: bytes, req: Request) -> None:
        member = req.args["member"]
        limit = req.args.get("limit") or self.heartbeat_limit
        now = time.monotonic()
        info = req.args.get("info") or {}
        known = self._members.get(member)
        if known is None:
            if not self._members:
                self._next_heartbeat_check = now + _HEARTBEAT_CHECK_S
            self._members[member] = _Member(limit, now, info)
        else:
            if known.silent:
                known.silent = False
                self._publish(*self._heard_event(member, known, now - known.last_seen))
            known.last_seen, known.limit = now, limit
            if info:
                known.info = info
        self._send_ok(identity, req.id)

    def _op_heartbeat_stop(self, identity: bytes, req: Request) -> None:
        existed = self._members.pop(req.args["member"], None) is not None
        self._send_ok(identity, req.id, existed)

    # ------------------------------------------------------------------ store internals

    def _put(self, key: str, value: bytes) -> None:
        self._data[key] = value
        waiters = self._waiters_by_key.pop(key, None)
        if waiters:
            for waiter in waiters:
                if not waiter.done:
                    self._try_complete(waiter)

    def _missing(self, keys: list[str]) -> list[str]:
        return [key for key in keys if key not in self._data]

    def _get_or_park(self, identity: bytes, req: Request, keys: list[str]) -> None:
        missing = self._missing(keys)
        if not missing:
            self._send_ok(identity, req.id, self._result(req.op, keys))
            return
        if req.args.get("timeout") == 0:
            raise ProtocolViolation("timeout", f"{req.op}: keys not present: {missing[:8]}")
        waiter = self._park(identity, req, keys)
        for key in missing:
            self._waiters_by_key.setdefault(key, []).append(waiter)

    def _result(self, op: str, keys: list[str]) -> Any:
        if op == "get":
            return self._data[keys[0]]
        if op == "multi_get":
            return [self._data[key] for key in keys]
        return None

    def _park(self, identity: bytes, req: Request, keys: list[str]) -> _Waiter:
        if self._pending >= self._max_pending:
            raise ProtocolViolation("limit", f"{req.op}: the server already holds "
                                             f"{self._max_pending} blocked requests")
        timeout = req.args.get("timeout")
        now = time.monotonic()
        deadline = now + (proto.MAX_TIMEOUT_S if timeout is None else timeout)
        waiter = _Waiter(identity, req.id, req.op, keys, deadline, now, dict(req.args))
        heapq.heappush(self._deadlines, (deadline, next(self._tiebreak), waiter))
        self._pending += 1
        return waiter

    def _finish(self, waiter: _Waiter) -> None:
        waiter.done = True
        self._pending -= 1

    def _try_complete(self, waiter: _Waiter) -> None:
        missing = self._missing(waiter.keys)
        if missing:  # a key was deleted meanwhile; keep waiting for what is missing
            for key in missing:
                bucket = self._waiters_by_key.setdefault(key, [])
                if waiter not in bucket:
                    bucket.append(waiter)
            return
        self._finish(waiter)
        self._send_ok(waiter.identity, waiter.request_id, self._result(waiter.op, waiter.keys))

    def _pop_queue(self, key: str) -> bytes:
        items = self._queues[key]
        value = items.popleft()
        if not items:
            del self._queues[key]
        return value

    def _serve_queue(self, key: str) -> None:
        waiters = self._queue_waiters.get(key)
        while waiters and self._queues.get(key):
            waiter = waiters.popleft()
            if waiter.done:
                continue
            self._finish(waiter)
            self._send_ok(waiter.identity, waiter.request_id, self._pop_queue(key))
        if waiters is not None and not waiters:
            del self._queue_waiters[key]

    def _expire_waiters(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, waiter = heapq.heappop(self._deadlines)
            if waiter.done:
                continue
            self._finish(waiter)
            self._unlist(waiter)
            waited = now - waiter.started
            if waiter.op == "events":
                self._send_ok(waiter.identity, waiter.request_id, [])
                continue
            missing = self._missing(waiter.keys) if waiter.op != "queue_pop" else waiter.keys
            self._send_error(
                waiter.identity, waiter.request_id, "timeout",
                f"{waiter.op} timed out after {waited:.3f} s waiting for "
                f"{'queue' if waiter.op == 'queue_pop' else 'keys'} {missing[:8]}"
                + (f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""),
                missing[:64])
        if self._pending == 0:
            self._event_waiters.clear()
            self._queue_waiters.clear()
        elif len(self._event_waiters) > 2 * self._pending + 64:
            self._event_waiters = [w for w in self._event_waiters if not w.done]

    def _unlist(self, waiter: _Waiter) -> None:
        """Forget an expired waiter under the keys it was waiting for (nobody set them)."""
        if waiter.op == "queue_pop":
            line = self._queue_waiters.get(waiter.keys[0])
            if line is not None:
                try:
                    line.remove(waiter)
                except ValueError:
                    pass
                if not line:
                    del self._queue_waiters[waiter.keys[0]]
            return
        for key in waiter.keys:
            bucket = self._waiters_by_key.get(key)
            if bucket is None:
                continue
            try:
                bucket.remove(waiter)
            except ValueError:
                continue
            if not bucket:
                del self._waiters_by_key[key]

    def _fail_all_waiters(self, message: str) -> None:
        for _, _, waiter in self._deadlines:
            if not waiter.done:
                self._finish(waiter)
                self._send_error(waiter.identity, waiter.request_id, "unavailable", message)
        self._deadlines.clear()

    # ------------------------------------------------------------------ events

    def _publish(self, topic: str, payload: dict[str, Any]) -> Event:
        payload = dict(payload)
        payload.setdefault("ts", time.time())
        payload.setdefault("run_id", self.run_id)
        event = Event(self._next_seq, topic, payload)
        self._next_seq += 1
        self.stats["events"] += 1
        self._events.append(event)
        if len(self._events) > self._max_events:
            dropped = self._events.popleft()
            self._data.pop(event_key(dropped.seq), None)
        self._put(event_key(event.seq), proto.encode(event.to_wire()))
        still_waiting: list[_Waiter] = []
        for waiter in self._event_waiters:
            if waiter.done:
                continue
            topics = waiter.args.get("topics")
            if topics is not None and topic not in topics:
                still_waiting.append(waiter)
                continue
            found = self._events_after(waiter.args["since"], topics)
            self._finish(waiter)
            self._send_ok(waiter.identity, waiter.request_id, [e.to_wire() for e in found])
        self._event_waiters = still_waiting
        _log.info("event %d %s %s", event.seq, topic, payload)
        return event

    def _events_after(self, since: int, topics: list[str] | None) -> list[Event]:
        if not self._events or since >= self._events[-1].seq:
            return []
        first = self._events[0].seq
        start = max(0, since + 1 - first)
        found: list[Event] = []
        for index in range(start, len(self._events)):
            event = self._events[index]
            if topics is None or event.topic in topics:
                found.append(event)
                if len(found) >= _MAX_EVENTS_PER_REPLY:
                    break
        return found

    # ------------------------------------------------------------------ heartbeats

    def _check_heartbeats(self, now: float) -> None:
        if not self._members or now < self._next_heartbeat_check:
            return
        self._next_heartbeat_check = now + _HEARTBEAT_CHECK_S
        lost = [(name, m) for name, m in self._members.items()
                if not m.silent and now - m.last_seen > m.limit]
        for name, member in lost:
            silent = now - member.last_seen
            if self.rank_silence == "suspect" and self._rank_of(name) is not None:
                member.silent = True  # kept: its next beat is published as ``rank_heard``
                self._publish(RANK_SILENT, {**self._rank_fields(name, member),
                                            "silent_s": round(silent, 3)})
                continue
            del self._members[name]
            _log.warning("member %s sent no heartbeat for %.2f s (limit %.2f s)",
                         name, silent, member.limit)
            self._publish(*self._lost_event(name, member, silent))

    @staticmethod
    def _rank_of(name: str) -> int | None:
        kind, _, index = name.partition("/")
        return int(index) if kind == "rank" and index.isdigit() else None

    def _rank_fields(self, name: str, member: _Member) -> dict[str, Any]:
        fields: dict[str, Any] = {"rank": self._rank_of(name), "member": name,
                                  "reason": "heartbeat"}
        for key, kind in (("host", str), ("pid", int)):
            value = member.info.get(key)
            if isinstance(value, kind) and not isinstance(value, bool):
                fields[key] = value
        return fields

    def _heard_event(self, name: str, member: _Member, silent: float) -> tuple[str, dict[str, Any]]:
        return RANK_HEARD, {**self._rank_fields(name, member), "silent_s": round(silent, 3)}

    @staticmethod
    def _lost_event(name: str, member: _Member, silent: float) -> tuple[str, dict[str, Any]]:
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

