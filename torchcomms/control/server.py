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

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import zmq

from torchcomms.config import settings

from . import protocol as proto
from .arguments import check_server_args
from .auth import ServerAuthenticator
from .errors import ControlArgumentError, ControlClosedError, ControlError, ControlUnavailableError
from .event_log import EventLog
from .events import EVENT_KEY_PREFIX, Event, EventSchemaError, event_key, validate_event
from .kvstore import KeyValueStore, Waiter
from .membership import Members
from .protocol import Limits, ProtocolViolation, Request
from .router import HANDSHAKE_S, SocketReplies, bind_router
from .secrets import derive_keys, load_secret

__all__ = ["StoreServer", "DEFAULT_HEARTBEAT_LIMIT_S"]

DEFAULT_HEARTBEAT_LIMIT_S = 1.5
_log = logging.getLogger("torchcomms.control.server")


class StoreServer:
    """The job's control-plane server.

    ``secret`` is the per-job secret (bytes); ``None`` reads it from the environment
    (:func:`~torchcomms.control.secrets.load_secret`). ``heartbeat_limit`` is how long a
    member may stay silent before it is reported lost (members may ask for their own).
    ``rank_silence`` is ``"failed"`` (a silent ``rank/<n>`` is published as ``rank_failed``)
    or ``"suspect"`` (published as ``rank_silent``, then ``rank_heard`` if it beats again:
    a supervisor that sees the rank's process decides whether it failed). ``max_beat_rate``
    bounds the heartbeats a second of all members together (default
    ``TORCHCOMM_CONTROL_MAX_BEAT_RATE``): past it, members are asked to beat less often and
    their silence limits stretch alike. A connection that has not completed its CURVE
    handshake within ``handshake_s`` seconds is closed.
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
        max_beat_rate: float | None = None,
        handshake_s: float = HANDSHAKE_S,
    ) -> None:
        if max_beat_rate is None:
            max_beat_rate = settings().control_max_beat_rate
        check_server_args(host, port, heartbeat_limit, max_pending, max_events, rank_silence,
                          max_beat_rate, handshake_s)
        self._keys = derive_keys(load_secret() if secret is None else secret)
        self._host = host
        self._port = port
        self.heartbeat_limit = float(heartbeat_limit)
        self.rank_silence = rank_silence
        self.max_beat_rate = float(max_beat_rate)
        self.handshake_s = float(handshake_s)
        self.run_id = run_id if run_id is not None else (
            settings().run_id or settings().torchelastic_run_id or "")
        self.limits = limits or Limits()

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
        self._store = KeyValueStore(self.limits, SocketReplies(self._send, self._send_error),
                                    max_pending)
        self._history = EventLog(max_events, self.limits.max_event_log_bytes)
        self._members = Members(rank_silence)
        self.stats: dict[str, int] = {"requests": 0, "errors": 0, "events": 0}

    # the parked requests (read by tests that check nothing is left behind)
    @property
    def _pending(self) -> int:
        return self._store.pending

    @property
    def _waiters_by_key(self) -> dict[str, list[Waiter]]:
        return self._store.waiters_by_key

    @property
    def _queue_waiters(self) -> dict[str, deque[Waiter]]:
        return self._store.queue_waiters

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
            self._router, self._address = bind_router(ctx, self._host, self._port, self._keys,
                                                      self.limits, self.handshake_s)
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

    def drop_keys_except(self, keep: tuple[str, ...], timeout: float = 10.0) -> int:
        """Drop the keys under none of the prefixes ``keep`` nor the event log's; how many."""
        return int(self._run_in_loop(lambda: self._store.drop_all_but((*keep, EVENT_KEY_PREFIX)), timeout))

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
                self._store.expire(now)
                for topic, payload in self._members.check(now):
                    self._publish(topic, payload)
            except Exception:  # noqa: BLE001 - the server must keep serving
                _log.exception("control server loop error (continuing)")
        self._store.fail_all("the control server is stopping")
        self._drain_commands()

    def _poll_timeout_ms(self) -> int:
        now = time.monotonic()
        wake = now + 1.0
        deadline = self._store.next_deadline()
        if deadline is not None:
            wake = min(wake, deadline)
        if self._members:
            wake = min(wake, self._members.next_check)
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
        handler = getattr(self, f"_op_{req.op}", None) or getattr(self._store, f"op_{req.op}")
        handler(identity, req)

    def _op_hello(self, identity: bytes, req: Request) -> None:
        self._send_ok(identity, req.id, {
            "version": proto.PROTOCOL_VERSION,
            "run_id": self.run_id,
            "heartbeat_limit": self.heartbeat_limit,
            "max_key_bytes": self.limits.max_key_bytes,
            "max_value_bytes": self.limits.max_value_bytes,
            "max_message_bytes": self.limits.max_message_bytes,
            "last_event_seq": self._history.last_seq,
        })

    def _op_ping(self, identity: bytes, req: Request) -> None:
        self._send_ok(identity, req.id, "pong")

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
        found = self._history.after(since, topics)
        if found or req.args.get("timeout") == 0:
            self._send_ok(identity, req.id, [e.to_wire() for e in found])
            return
        self._store.park_events(identity, req)

    def _op_heartbeat(self, identity: bytes, req: Request) -> None:
        member = req.args["member"]
        interval, limit = self._members.pace(member, req.args.get("interval"),
                                             req.args.get("limit") or self.heartbeat_limit,
                                             self.max_beat_rate)
        heard = self._members.beat(member, limit, req.args.get("info") or {}, time.monotonic(),
                                   self.limits.max_member_bytes)
        if heard is not None:
            self._publish(*heard)
        self._send_ok(identity, req.id, {"interval": interval, "limit": limit})

    def _op_heartbeat_stop(self, identity: bytes, req: Request) -> None:
        existed = self._members.forget(req.args["member"])
        self._send_ok(identity, req.id, existed)

    # ------------------------------------------------------------------ events

    def _publish(self, topic: str, payload: dict[str, Any]) -> Event:
        event, packed, dropped = self._history.append(topic, payload, self.run_id)
        self.stats["events"] += 1
        for old in dropped:
            self._store.pop(event_key(old.seq))
        self._store.put(event_key(event.seq), packed, bounded=False)
        self._store.wake_event_waiters(topic, self._history.after)
        _log.info("event %d %s %s", event.seq, topic, event.payload)
        return event
