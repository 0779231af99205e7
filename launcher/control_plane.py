"""The agent's handle on the job's control plane: hosted in-process, or joined remotely.

The rendezvous agent runs :class:`torchcomms.control.server.StoreServer` in its own process
(so the store outlives every worker) and talks to it through a local client like everyone
else; other agents join with a :class:`~torchcomms.control.client.ControlClient`
authenticated by the job secret.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from torchcomms.control.client import ControlClient
from torchcomms.control.errors import (
    ControlAuthError,
    ControlError,
    ControlHandshakeTimeoutError,
    ControlTimeoutError,
    ControlUnavailableError,
)
from torchcomms.control.server import StoreServer

from .exceptions import AuthenticationError, ControlPlaneLostError, RendezvousError, RendezvousTimeoutError
from .rendezvous import KEY_ROOT

__all__ = ["ControlPlane"]

#: the first and last bytes of the greeting every ZeroMQ (ZMTP 3) peer sends at once on a connection
_ZMTP_SIGNATURE = (0xFF, 0x7F)

_PROBE_KEY = f"{KEY_ROOT}/probe"


class ControlPlane:
    """A connected control plane: ``kv`` for store operations, ``publish`` for events."""

    def __init__(self, client: ControlClient, address: str,
                 server: StoreServer | None = None) -> None:
        self.kv = client
        self.address = address
        self.server = server
        self._subs: list[Any] = []

    @property
    def is_host(self) -> bool:
        return self.server is not None

    @classmethod
    def host(cls, *, bind_host: str, port: int, advertise_host: str, secret: bytes,
             run_id: str) -> ControlPlane:
        """Start the job's store server here (raises ``ControlUnavailableError`` if the
        port is taken) and connect a local client to it."""
        # The agents see their ranks' processes: a rank's silent heartbeats are a suspicion
        # for its agent to judge (launcher.liveness), not a failure to announce.
        server = StoreServer(bind_host, port, secret, run_id=run_id,
                             rank_silence="suspect").start()
        address = f"tcp://{advertise_host}:{server.port}"
        local = f"tcp://127.0.0.1:{server.port}" if bind_host in ("0.0.0.0", "127.0.0.1") \
            else address
        try:
            client = ControlClient(local, secret, timeout=30.0)
        except BaseException:
            server.stop()
            raise
        return cls(client, address, server)

    @classmethod
    def join(cls, *, address: str, secret: bytes, timeout: float, secret_source: str,
             request_timeout: float = 10.0) -> ControlPlane:
        """Connect to the rendezvous host's store, retrying until ``timeout``.

        A refused secret fails at once with :class:`AuthenticationError`; a refusal by a peer that
        does not greet as ZeroMQ does (another program on the port) with :class:`RendezvousError`
        saying so. A host that accepts
        connections but never completes the handshake (its agent stopped or hung: the kernel
        still completes TCP connections) is retried like an absent one, and the
        :class:`RendezvousTimeoutError` at ``timeout`` says so. ``request_timeout`` bounds
        each probe and, afterwards, every call of the returned client."""
        deadline = time.monotonic() + timeout
        probe = max(0.2, min(request_timeout, timeout))
        client = ControlClient(address, secret, timeout=probe)
        silent = False
        while True:
            started = time.monotonic()
            # A fresh connection's handshake interval is its call's budget, so a silent host
            # fails each probe by the deadline at the latest.
            client.timeout = max(0.2, min(probe, deadline - started))
            try:
                client.check([_PROBE_KEY])
                client.timeout = request_timeout
                return cls(client, address)
            except ControlAuthError as exc:
                # A refusal is an answer and comes within a round trip; a handshake that
                # timed out is silence, whatever the client makes of it.
                if time.monotonic() - started < client.timeout / 2:
                    client.close()
                    not_zmtp = _no_zmtp_greeting(address, timeout=max(0.2, min(1.0, deadline - time.monotonic())))
                    if not_zmtp:
                        raise RendezvousError(f"the rendezvous endpoint {address} is no torchcomms-run agent: it "
                                              f"{not_zmtp} (is another program listening on that port?)")
                    raise AuthenticationError(
                        f"the rendezvous host at {address} refused this agent's job secret "
                        f"(from {secret_source}): every node of a job must use the same secret "
                        f"({exc})"
                    ) from None
                silent, last = True, exc
            except ControlHandshakeTimeoutError as exc:
                silent, last = True, exc  # connected, never answered: a stopped or hung host
            except (ControlTimeoutError, ControlUnavailableError) as exc:
                last = exc  # (a stopped host's full accept queue ends in this, too)
            now = time.monotonic()
            if now >= deadline:
                client.close()
                why = ("it accepts connections but never completes the handshake (is its agent "
                       "stopped, e.g. by SIGSTOP, or hung? or is another program listening "
                       "there?)" if silent else
                       f"is the agent of the rendezvous node running and reachable? ({last})")
                raise RendezvousTimeoutError(
                    address, [], 1, timeout,
                    message=f"rendezvous host at {address} did not answer within "
                            f"{timeout:g} s: {why}") from last
            time.sleep(min(0.2, deadline - now))

    def publish(self, topic: str, payload: dict[str, Any]) -> None:
        """Publish an event (in-process on the host, over the network elsewhere)."""
        if self.server is not None:
            self.server.publish(topic, payload)
        else:
            self.kv.publish(topic, payload)

    def reset_worker_keys(self) -> int:
        """On the rendezvous host, between a round and its restart: drop every key the
        previous round's workers left (their communicators' rendezvous, agreement decisions,
        the user's own keys), keeping the launcher's own (under ``torchcomms-run/``) and the event log. A
        restarted group then meets in a store as fresh as the first attempt's, as under
        torchrun, whose store each attempt's rank 0 hosts anew. Returns how many were dropped."""
        assert self.server is not None, "only the rendezvous host resets the store"
        return self.server.drop_keys_except((f"{KEY_ROOT}/",))

    def forget_member(self, member: str) -> bool:
        """Deregister another process's heartbeat member (a worker that has exited), so the
        server does not report it lost later (e.g. while its restarted successor runs).
        Returns whether it was still registered (a worker deregisters at a normal exit)."""
        return self.kv.heartbeat_forget(member, timeout=min(5.0, self.kv.timeout))

    def subscribe(self, topics: list[str], callback: Callable[[str, dict[str, Any]], None]) -> None:
        """Deliver events of ``topics`` (replaying earlier ones) to ``callback``."""
        wanted = frozenset(topics)

        def deliver(topic: str, payload: dict[str, Any]) -> None:
            if topic in wanted:
                callback(topic, payload)

        # Subscribe to every topic and filter here: the client's topic check validates the
        # topic against an empty payload, which refuses the project's own topics.
        self._subs.append(self.kv.subscribe(None, deliver))

    def close_subscriptions(self) -> None:
        """Stop event delivery (before the host goes away, to end quietly)."""
        for sub in self._subs:
            try:
                sub.close()
            except ControlError:
                pass
        self._subs.clear()

    def close(self) -> None:
        for sub in self._subs:
            try:
                sub.close()
            except ControlError:
                pass
        self._subs.clear()
        try:
            self.kv.close()
        except ControlError:
            pass
        if self.server is not None:
            self.server.stop()


def lost(exc: BaseException, address: str, doing: str = "") -> ControlPlaneLostError:
    """The error an agent raises when the rendezvous host stops answering ``while doing``."""
    if isinstance(exc, ControlAuthError):  # this secret was accepted before: it is silence
        exc = ControlUnavailableError("it accepted a new connection but never completed its "
                                      "handshake")
    during = f" while {doing}" if doing else ""
    return ControlPlaneLostError(f"lost the rendezvous host at {address}{during}: {exc}")


def _no_zmtp_greeting(address: str, timeout: float) -> str | None:
    """What a peer at ``tcp://host:port`` that is no ZeroMQ endpoint did instead of greeting (it
    closed the connection, or sent other bytes); ``None`` when it greeted as ZeroMQ does (a server
    that refuses a wrong secret), stayed silent or could not be reached: nothing to tell then."""
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as conn:
            data = b""
            while len(data) < 10:
                chunk = conn.recv(10 - len(data))
                if not chunk:
                    return "closed the connection without the greeting every ZeroMQ peer sends"
                data += chunk
    except ConnectionResetError:
        return "reset the connection without the greeting every ZeroMQ peer sends"
    except (OSError, ValueError):
        return None  # silent (socket.timeout is an OSError) or unreachable
    if (data[0], data[9]) != _ZMTP_SIGNATURE:
        return f"answered {data!r}, not the greeting every ZeroMQ peer sends"
    return None
