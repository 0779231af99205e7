"""CURVE authentication of the control plane.

Server side: the ROUTER socket is a CURVE server with the job's server key pair, and a ZAP
authenticator (a thread of the server's own ZeroMQ context) admits exactly one client public
key, the one derived from the same job secret. Client side: sockets are CURVE clients with
the job's client key pair, and :class:`HandshakeWatch` reads the socket monitor so that a
refused handshake becomes a :class:`~torchcomms.control.errors.ControlAuthError` at once
instead of a silent hang.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import parse_monitor_message

from .errors import ControlAuthError
from .secrets import CurveKeys

__all__ = ["ZAP_DOMAIN", "ServerAuthenticator", "configure_server_socket",
           "configure_client_socket", "HandshakeWatch", "MONITOR_EVENTS"]

ZAP_DOMAIN = "torchcomms-control"
#: refused handshakes are summed up in one warning at most this often
REFUSAL_LOG_INTERVAL_S = 60.0

_log = logging.getLogger("torchcomms.control.auth")


class _SingleKeyProvider:
    """ZAP credentials provider admitting one CURVE public key (Z85).

    The first refusal is logged; later ones are counted and logged as one summary with the
    first refusal at least :data:`REFUSAL_LOG_INTERVAL_S` after the last line: a stranger can
    open handshakes as fast as it likes, and each must not become a line in the agent's log
    (``ServerAuthenticator.refused`` counts them all)."""

    def __init__(self, allowed_public_z85: bytes,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._allowed = allowed_public_z85
        self.refused = 0
        self._lock = threading.Lock()
        self._clock = clock
        self._logged_at: float | None = None
        self._unlogged = 0

    def callback(self, domain: str, key: bytes) -> bool:
        if key == self._allowed:
            return True
        with self._lock:
            self.refused += 1
            now = self._clock()
            if self._logged_at is not None and now - self._logged_at < REFUSAL_LOG_INTERVAL_S:
                self._unlogged += 1
                return False
            first, more, total = self._logged_at is None, self._unlogged, self.refused
            self._logged_at, self._unlogged = now, 0
        if first:
            _log.warning("control server refused a client with an unknown CURVE key (further "
                         "refusals are summed up every %g s)", REFUSAL_LOG_INTERVAL_S)
        else:
            _log.warning("control server refused %d clients with an unknown CURVE key (%d in all)",
                         more + 1, total)
        return False


class ServerAuthenticator:
    """Runs the ZAP handler that admits only the job's client key."""

    def __init__(self, context: zmq.Context, keys: CurveKeys) -> None:
        self._keys = keys
        self._provider = _SingleKeyProvider(keys.client_public)
        self._auth = ThreadAuthenticator(context, log=logging.getLogger("torchcomms.control.zap"))

    @property
    def refused(self) -> int:
        """How many handshakes the authenticator refused so far."""
        return self._provider.refused

    def start(self) -> None:
        self._auth.start()
        self._auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=self._provider)

    def stop(self) -> None:
        if self._auth.is_alive():
            self._auth.stop()


def configure_server_socket(sock: zmq.Socket, keys: CurveKeys) -> None:
    """Make ``sock`` a CURVE server that authenticates through the job's ZAP domain."""
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
    sock.curve_secretkey = keys.server_secret
    sock.curve_publickey = keys.server_public
    sock.curve_server = True


def configure_client_socket(sock: zmq.Socket, keys: CurveKeys) -> None:
    """Make ``sock`` a CURVE client holding the job's client key pair."""
    sock.curve_secretkey = keys.client_secret
    sock.curve_publickey = keys.client_public
    sock.curve_serverkey = keys.server_public


MONITOR_EVENTS = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


class HandshakeWatch:
    """Interprets a client socket's monitor events.

    ``established`` is true while a connection whose CURVE handshake succeeded is up;
    ``auth_failure`` holds a :class:`ControlAuthError` once the server refused us (ZAP
    denial, a cryptographic failure from a wrong secret, or a connection closed during the
    handshake); ``unanswered`` is set when a handshake ran out of its interval with no answer
    at all (libzmq reports that as a failure with ``EAGAIN``: a stopped or hung server, or a
    peer that does not speak ZMTP), which is silence, not a refusal; ``lost`` is set when an
    established connection went down.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self.established = False
        self.ever_established = False
        self.lost = False
        self.auth_failure: ControlAuthError | None = None
        self.unanswered = False
        self._connected = False

    @property
    def connected(self) -> bool:
        """Whether a TCP connection is up (its handshake may still be pending)."""
        return self._connected

    def _refused(self, detail: str) -> ControlAuthError:
        return ControlAuthError(
            f"control server at {self.address} refused the CURVE handshake ({detail}): "
            "this client's job secret does not match the server's (check "
            "TORCHCOMM_CONTROL_SECRET_FILE / TORCHCOMM_CONTROL_SECRET)"
        )

    def feed(self, frames: list[Any]) -> None:
        message = parse_monitor_message(frames)
        event, value = message["event"], int(message["value"])
        if event == zmq.EVENT_CONNECTED:
            self._connected = True
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.established = self.ever_established = True
            self.auth_failure = None
            self.unanswered = False
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.auth_failure = self._refused("authentication denied")
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and value == errno.EAGAIN:
            if not self.established:
                self.unanswered = True  # the handshake interval ran out: silence
        elif event in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            if not self.established:
                self.auth_failure = self._refused("handshake failed")
        elif event == zmq.EVENT_DISCONNECTED:
            if self.established:
                self.lost = True
            elif self._connected and self.auth_failure is None and not self.unanswered:
                self.auth_failure = self._refused("connection closed during the handshake")
            self.established = False
            self._connected = False
