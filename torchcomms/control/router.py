"""The server's listening socket: a CURVE-authenticated ZeroMQ ROUTER with its size limit,
queue bounds and keepalives, bound to ``host:port``, and the address clients reach it at.

What keeps strangers and idle peers from crowding out the job's clients: a connection that has
not completed its CURVE handshake within ``handshake_s`` is closed (the greeting and the
handshake of a client holding the job's key take milliseconds; one with a wrong key is closed
as soon as the authenticator refuses it); a peer whose host is gone is closed by TCP keepalive
probes (``KEEPALIVE_*``); replies to a peer that does not read them
are dropped past ``QUEUE_LIMIT`` queued messages instead of blocking the server; requests are
taken from the peers in turn (ZeroMQ's fair queueing), so one flooding peer slows the others
by its share only; and the process's open-file limit is raised to its hard limit, so that
connections do not run out of descriptors first.

The server sends no ZMTP heartbeats and its clients ask for no heartbeat TTL: libzmq cancels a
timer by walking every timer of its I/O thread, and each heartbeat re-arms one, so with
thousands of peers the I/O thread spent its time walking timers (at 4,096 peers, half of its
CPU in ``std::_Rb_tree_increment``; replies piled up unsent until clients gave up).
"""

from __future__ import annotations

import resource
import socket
from collections.abc import Callable
from typing import Any

import zmq

from . import protocol as proto
from .auth import configure_server_socket
from .errors import ControlUnavailableError
from .protocol import Limits

__all__ = ["bind_router", "SocketReplies", "HANDSHAKE_S", "KEEPALIVE_IDLE_S", "QUEUE_LIMIT"]

#: how long a connection may take to complete its CURVE handshake before it is closed
HANDSHAKE_S = 2.0
#: TCP keepalive: probes start after this much silence, every KEEPALIVE_INTERVAL_S, and the
#: connection is closed after KEEPALIVE_PROBES unanswered ones (a peer whose host is gone)
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_PROBES = 3
#: messages queued per peer, each way, before further ones are dropped
QUEUE_LIMIT = 10_000


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def bind_router(ctx: zmq.Context, host: str, port: int, keys: Any, limits: Limits,
                handshake_s: float = HANDSHAKE_S) -> tuple[zmq.Socket, str]:
    """Bind a ROUTER on ``host:port`` (0: any free port); returns it and ``tcp://host:port``
    to advertise (the machine's name when bound to every interface)."""
    raise_open_file_limit()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 200
    router.setsockopt(zmq.MAXMSGSIZE, limits.hard_message_bytes)
    router.setsockopt(zmq.SNDHWM, QUEUE_LIMIT)
    router.setsockopt(zmq.RCVHWM, QUEUE_LIMIT)
    router.setsockopt(zmq.HANDSHAKE_IVL, max(1, int(handshake_s * 1000)))
    router.setsockopt(zmq.TCP_KEEPALIVE, 1)
    router.setsockopt(zmq.TCP_KEEPALIVE_IDLE, KEEPALIVE_IDLE_S)
    router.setsockopt(zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_INTERVAL_S)
    router.setsockopt(zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_PROBES)
    if ":" in host:
        router.setsockopt(zmq.IPV6, 1)
    configure_server_socket(router, keys)
    bind_host = f"[{host}]" if ":" in host else host
    try:
        router.bind(f"tcp://{bind_host}:{port or '*'}")
    except zmq.ZMQError as exc:
        router.close(0)
        raise ControlUnavailableError(
            f"control server cannot bind tcp://{bind_host}:{port}: {exc}") from exc
    endpoint = router.getsockopt(zmq.LAST_ENDPOINT).decode()
    bound_port = int(endpoint.rsplit(":", 1)[1])
    advertised = host
    if advertised in ("0.0.0.0", "::", "*"):
        advertised = socket.gethostname()
    advertised = f"[{advertised}]" if ":" in advertised else advertised
    return router, f"tcp://{advertised}:{bound_port}"


class SocketReplies:
    """The store's answers, sent on the server's socket."""

    def __init__(self, send: Callable[[bytes, bytes], None], error: Callable[..., None]) -> None:
        self._send, self._error = send, error

    def ok(self, identity: bytes, request_id: int, value: Any = None) -> None:
        self._send(identity, proto.encode_ok(request_id, value))

    def ok_packed(self, identity: bytes, request_id: int, packed_value: bytes) -> None:
        self._send(identity, proto.encode_ok_packed(request_id, packed_value))

    def error(self, identity: bytes, request_id: int | None, code: str, message: str,
              keys: list[str] | None = None) -> None:
        self._error(identity, request_id, code, message, keys)
