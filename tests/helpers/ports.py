"""Ports for the servers a test starts (stores, rendezvous hosts), picked so that nothing else
on the machine takes them between the pick and the server's bind."""
from __future__ import annotations

import random
import socket

_FALLBACK_EPHEMERAL_LOW = 32768  # Linux's default ip_local_port_range starts here


def _ephemeral_low() -> int:
    """Where the kernel's range for outgoing connections' local ports begins."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_LOW


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port free on every interface now, below the ephemeral range.

    Binding port 0 hands out a port from the range the kernel also gives every outgoing
    connection as its local port: between the pick and the server's bind, another test's
    client (a store or gloo connection) could take it, and the server then fails to bind (a
    launcher agent that cannot host joins a rendezvous nobody hosts). Below that range only
    another server can take the port, and one picked at random from ~20,000 rarely collides."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    if low > 11000:
        for _ in range(100):
            port = rng.randrange(10000, low)
            if _bindable(port):
                return port
    with socket.socket() as s:  # no room below the range (or all taken): the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
