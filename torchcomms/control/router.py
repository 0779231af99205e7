"""The server's listening socket: a CURVE-authenticated ZeroMQ ROUTER with its size limit,
queue bounds and keepalives, bound to ``host:port``, and the address clients reach it at."""

from __future__ import annotations

import socket
from typing import Any

import zmq

from .auth import configure_server_socket
from .errors import ControlUnavailableError
from .protocol import Limits

__all__ = ["bind_router"]


def bind_router(ctx: zmq.Context, host: str, port: int, keys: Any,
                limits: Limits) -> tuple[zmq.Socket, str]:
    """Bind a ROUTER on ``host:port`` (0: any free port); returns it and ``tcp://host:port``
    to advertise (the machine's name when bound to every interface)."""
    router = ctx.socket(zmq.ROUTER)
    router.linger = 200
    router.setsockopt(zmq.MAXMSGSIZE, limits.hard_message_bytes)
    router.setsockopt(zmq.SNDHWM, 10_000)
    router.setsockopt(zmq.RCVHWM, 10_000)
    router.setsockopt(zmq.TCP_KEEPALIVE, 1)
    router.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 30)
    router.setsockopt(zmq.HEARTBEAT_IVL, 2000)
    router.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10_000)
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
