"""Which of this process's TCP connections belong to one gloo engine, so that abandoning the
engine can shut exactly those down (read from /proc; no-op where it is missing)."""
from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

from torchcomms.csrc.gloo_guard import threads

T = TypeVar("T")

#: serialises device creation in this process (see :meth:`EngineSockets.open_device`)
_DEVICE_LOCK = threading.Lock()
#: serialises the making of engines' own store clients (see :meth:`EngineSockets.store_client`)
_CLIENT_LOCK = threading.Lock()


def _socket_fds() -> dict[int, int]:
    """This process's socket descriptors: ``{fd: socket inode}`` (empty where /proc is missing)."""
    fds: dict[int, int] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return fds
    for name in names:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            fds[int(name)] = int(link[8:-1])
    return fds


#: how many times the TCP table is read, at most, to find every socket asked for
_TABLE_READS = 5


def _tcp_endpoints(wanted: set[int] | frozenset[int] = frozenset()) -> dict[int, tuple[str, str, str]]:
    """``{inode: (local, remote, state)}`` of the host's TCP sockets, as /proc/net/tcp{,6} write them.

    The kernel writes those files a chunk per read, so on a host whose connections come and go
    meanwhile one pass can skip entries: the table is read again (up to ``_TABLE_READS`` times,
    the passes merged) while a socket of ``wanted`` is missing from it."""
    table = _tcp_table()
    for _ in range(_TABLE_READS - 1):
        if wanted <= table.keys():
            break
        table = {**_tcp_table(), **table}
    return table


def _tcp_table() -> dict[int, tuple[str, str, str]]:
    """One pass over /proc/net/tcp and /proc/net/tcp6."""
    table: dict[int, tuple[str, str, str]] = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9:
                table[int(cols[9])] = (cols[1], cols[2], cols[3])
    return table


def _same_endpoint(addr: str, listener: str) -> bool:
    """``addr`` is ``listener`` (both ``HEXIP:HEXPORT``); a wildcard listener matches on the port."""
    ip, _, port = addr.partition(":")
    lip, _, lport = listener.partition(":")
    return port == lport and (ip == lip or not lip.strip("0"))


class EngineSockets:
    """The TCP connections of one gloo engine, so that an abandoned engine can be torn down.

    Gloo cannot cancel work: an op blocked on a stopped peer stays pending until its timeout
    or until that peer's connection dies, and then fails on a gloo thread that must take the
    GIL to run the op's Python callbacks. If that happens while the interpreter is finalizing,
    the thread is forced to exit from inside C++ and the process aborts (``terminate called
    after throwing an instance of 'gloo::IoException'``). Shutting the engine's connections
    down makes every pending op fail at once, while the interpreter still runs.

    The engine's sockets are the ones created while it was built that touch its own
    listener (accepted) or a peer's listener (connected); peers' listener addresses are
    exchanged through the engine's store. Its own store client's connection is recorded too
    (:meth:`store_client`): an abandoned engine is never destroyed, and that client would stay
    connected to the store's host for ever.
    """

    def __init__(self) -> None:
        self._before: dict[int, int] = {}
        self.listener: str | None = None
        self.fds: dict[int, int] = {}  # its connections to its peers
        self.store_fds: dict[int, int] = {}  # its own store client's (see store_client)
        self.loop_threads: frozenset[int] = frozenset()  # the threads the device started: its network thread

    def open_device(self, create: Callable[[], T]) -> T:
        """``create()`` the engine's device and find the listener it opened. One device at a
        time in this process (engines built concurrently, e.g. two communicators reconfigured
        at once, would each see both new listeners and know neither). The network thread the
        device started is recorded too."""
        with _DEVICE_LOCK:
            self._before = _socket_fds()
            before = threads()
            device = create()
            self.loop_threads = frozenset(threads() - before)
            new = [ino for fd, ino in _socket_fds().items() if self._before.get(fd) != ino]
            endpoints = _tcp_endpoints(set(new))
            listening = [endpoints[i][0] for i in new if i in endpoints and endpoints[i][2] == "0A"]
            self.listener = listening[0] if len(listening) == 1 else None
        return device

    def store_client(self, store: Any) -> Any:
        """A client of ``store``'s host of the engine's own (``store.clone()``: a connection of its
        own, recorded with the engine's, so shut down with them) where ``store`` is a TCPStore or
        a PrefixStore over one; else ``store`` itself (the control plane's client serves calls
        concurrently). Connects: blocks while the store's host does not answer."""
        inner = store
        while getattr(inner, "underlying_store", None) is not None:  # PrefixStore
            inner = inner.underlying_store
        if not isinstance(inner, dist.TCPStore):
            return store
        with _CLIENT_LOCK:  # another engine's client made meanwhile would look like this one's
            before = _socket_fds()
            try:
                client = store.clone()
            except Exception:  # noqa: BLE001 - no Store.clone, or no connection: the shared client, as before
                return store
            new = {fd: ino for fd, ino in _socket_fds().items() if before.get(fd) != ino}
        endpoints = _tcp_endpoints(set(new.values()))
        port = f":{inner.port:04X}"
        for fd, ino in new.items():
            if ino in endpoints and endpoints[ino][1].endswith(port):  # connected to the store's port
                self.store_fds[fd] = ino
        return client

    def engine_created(self, peer_listeners: list[str]) -> None:
        """Record the connections the engine opened towards its peers."""
        if self.listener is None:
            return
        fds = {fd: ino for fd, ino in _socket_fds().items() if self._before.get(fd) != ino}
        endpoints = _tcp_endpoints(set(fds.values()))
        for fd, ino in fds.items():
            if ino not in endpoints:
                continue
            local, remote, state = endpoints[ino]
            if state == "0A":
                continue
            if _same_endpoint(local, self.listener) or any(_same_endpoint(remote, p) for p in peer_listeners):
                self.fds[fd] = ino
        self._before = {}

    def shut_down(self) -> int:
        """Shut every recorded connection down (both directions), the store client's too;
        returns how many of those to its peers were."""
        done = sum(_shut_down(fd, ino) for fd, ino in self.fds.items())
        for fd, ino in self.store_fds.items():
            _shut_down(fd, ino)
        self.fds, self.store_fds = {}, {}
        return done


def _shut_down(fd: int, ino: int) -> bool:
    """Shut the connection of descriptor ``fd`` down (both directions), unless ``fd`` was closed
    and reused (its socket is no longer ``ino``); whether it was."""
    try:
        dup = os.dup(fd)
    except OSError:
        return False
    try:
        if os.fstat(dup).st_ino != ino:  # the descriptor was closed and reused
            return False
        with socket.socket(fileno=dup) as s:
            dup = -1
            s.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        if dup >= 0:
            os.close(dup)
