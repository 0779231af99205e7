"""The request/reply core of a control client: a pool of authenticated DEALER sockets,
request ids (stale replies are discarded), a deadline on every call, and typed failures.

:class:`Connection` is thread-safe: each call borrows a :class:`Channel` (one socket used by
one thread at a time), so any number of threads can block in server-side waits at once.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from typing import Any

import zmq

from . import protocol as proto
from .auth import MONITOR_EVENTS, HandshakeWatch, configure_client_socket
from .errors import (
    ControlArgumentError,
    ControlCancelledError,
    ControlClosedError,
    ControlHandshakeTimeoutError,
    ControlNoReplyError,
    ControlUnavailableError,
)
from .protocol import Limits

__all__ = ["Channel", "Connection", "REPLY_GRACE_S"]

#: how long past a server-side wait a call waits for its answer
REPLY_GRACE_S = 2.0
_POLL_SLICE_S = 0.1  # blocked calls notice close() within this


class Channel:
    """One DEALER socket with its monitor; used by one thread at a time."""

    def __init__(self, ctx: zmq.Context, addr: str, keys: Any, handshake_s: float) -> None:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.setsockopt(zmq.HANDSHAKE_IVL, max(100, int(handshake_s * 1000)))
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
        # no HEARTBEAT_TTL: it makes the server re-arm a timer per ping, and libzmq cancels
        # timers by walking all of them (quadratic in the server's peers; see router.py)
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


class Connection:
    """The sockets of one client to the server at ``address`` and the calls made on them."""

    def __init__(self, address: str, keys: Any, timeout: float, limits: Limits) -> None:
        self.address = address
        self._keys = keys
        #: default deadline (seconds) of every call
        self.timeout = timeout
        self.limits = limits
        self._ctx = zmq.Context()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._idle: list[Channel] = []
        self._channels: set[Channel] = set()
        self._active_calls = 0
        self._closed = False
        self._cancelled: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
        self._pid = os.getpid()

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        """Raise :class:`ControlClosedError` if the connection is closed."""
        with self._lock:
            if self._closed:
                raise ControlClosedError(f"control client for {self.address} is closed")

    def cancel_calls_of(self, thread: threading.Thread) -> None:
        """Fail the call ``thread`` is blocked in, and every later one, with
        :class:`ControlCancelledError`."""
        with self._lock:
            self._cancelled.add(thread)

    def _cancelled_here(self) -> bool:
        return bool(self._cancelled) and threading.current_thread() in self._cancelled

    def new_channel(self) -> Channel:
        """A socket of its own, for a thread that calls on it repeatedly (pass it to
        :meth:`call`; give it back with :meth:`discard_channel`)."""
        with self._lock:
            if self._closed:
                raise ControlClosedError(f"control client for {self.address} is closed")
            channel = Channel(self._ctx, self.address, self._keys, min(self.timeout, 10.0))
            self._channels.add(channel)
        return channel

    def _acquire(self) -> Channel:
        with self._lock:
            if self._closed:
                raise ControlClosedError(f"control client for {self.address} is closed")
            if self._idle:
                return self._idle.pop()
        return self.new_channel()

    def _release(self, channel: Channel) -> None:
        with self._lock:
            if not self._closed and channel in self._channels:
                self._idle.append(channel)
                return
        self.discard_channel(channel)

    def discard_channel(self, channel: Channel) -> None:
        """Close ``channel`` (after a failure on it, or when its thread ends)."""
        with self._lock:
            if channel not in self._channels:
                return
            self._channels.discard(channel)
            channel.close()

    def call(self, op: str, fields: dict[str, Any], *, budget: float,
              channel: Channel | None = None, stop: threading.Event | None = None) -> Any:
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
        chan: Channel | None = channel
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
                    self.discard_channel(chan)
        if not reply.ok:
            raise proto.error_from_reply(reply, f"control {op} failed")
        return reply.value

    def _exchange(self, chan: Channel, op: str, request_id: int, frame: bytes, budget: float,
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
                raise ControlNoReplyError(
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

    def close(self) -> None:
        """Refuse new calls, let running ones end (at most 1 s), close every socket."""
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
