"""Failure detection for communicators: the control plane's event bus and this rank's heartbeat.

One monitor per process and control-plane address. It subscribes to ``rank_failed`` and
``node_lost`` and tells every communicator it watches; it sends this rank's heartbeats so that
a hung (stopped, deadlocked) rank is reported by the server. A rank that learns it was itself
declared failed expels itself: its communicators abort and it cannot rejoin silently.
"""
from __future__ import annotations

import atexit
import os
import socket
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from torchcomms.config import settings
from torchcomms.control.host_process import host_running_check
from torchcomms.core.state import CommState

if TYPE_CHECKING:
    from torchcomms.core.comm_core import CommCore

_TOPICS = ["rank_failed", "node_lost"]
#: the ``rank_failed`` reason of a rank whose process exited 0 without a normal interpreter
#: exit (``os._exit``): it is gone, so agreements and engine builds do not wait for it and a
#: lost connection to it is attributed to it, but its communicators are not broken: a peer's op
#: that it completed before leaving (a broadcast it rooted) completes
LEFT = "left"
_CLOSED = frozenset({CommState.FINALIZED, CommState.SHRUNK, CommState.EXPELLED})


class FailureMonitor:
    """Routes failure events to the communicators of this process."""

    def __init__(self, client: Any, global_rank: int, until: float | None = None) -> None:
        """Subscribe and send the first heartbeat; with ``until`` (``time.monotonic()``) both
        are answered by then or raise (the control-plane client's error), whatever the client's
        own timeout."""
        def budget() -> float | None:
            return None if until is None else max(0.0, until - time.monotonic())

        self.global_rank = global_rank
        self._client = client
        self._lock = threading.Lock()
        self._comms: weakref.WeakSet[CommCore] = weakref.WeakSet()
        self._changed = threading.Condition(self._lock)
        self.failed: dict[int, str] = {}
        self.expelled: str | None = None
        self.control_lost: str | None = None
        self._host_running = host_running_check(settings().control_pid)
        since = int(client.hello(timeout=budget())["last_event_seq"])  # only events from now on
        self._sub = client.subscribe(_TOPICS, self._on_event, since=since, on_error=self._on_control_lost)
        self._heartbeat = False
        cfg = settings()
        interval, limit = cfg.heartbeat_s, cfg.heartbeat_limit_s
        # Deregistering at exit waits no longer than a heartbeat does: a server that cannot
        # answer within that is already failing this rank's heartbeats (and a stopped one never
        # answers), so exit is not held for the client's longer default.
        from torchcomms.control.client import heartbeat_budget  # (a control-plane client: zmq is loaded)

        self._deregister_s = heartbeat_budget(interval)
        # How long an engine-reported connection loss waits for the control plane to say who failed.
        self.attribution_wait_s = cfg.failure_attribution_s
        if interval > 0:
            try:
                client.heartbeat_start(
                    f"rank/{global_rank}", interval, limit=limit,
                    info={"host": socket.gethostname(), "pid": os.getpid()}, timeout=budget(),
                )
            except BaseException:
                self._sub.close()
                raise
            self._heartbeat = True
            atexit.register(self.stop)

    @property
    def client(self) -> Any:
        """The control-plane client it listens through."""
        return self._client

    def watch(self, comm: CommCore) -> None:
        """Route failure events to ``comm`` (it learns of this monitor as ``comm.monitor``)."""
        with self._lock:
            self._comms.add(comm)
        comm.monitor = self

    def finalized(self, comm: CommCore) -> None:
        """``comm`` was finalized: nothing to do (the launcher's agent sees this process's exit
        and its code; :meth:`stop` deregisters the heartbeat at exit)."""

    def known_failures(self) -> dict[int, str]:
        """Failed job ranks (global) and how each was seen to fail, as of now."""
        with self._lock:
            return dict(self.failed)

    def revive(self, ranks: list[int]) -> None:
        """Forget the failures of ``ranks``: new processes took those job ranks (they joined a
        communicator's rendezvous). A failure event of a previous process that arrives later
        would be taken for the new one's; the launcher publishes it within milliseconds of
        the exit, a replacement takes seconds to start."""
        with self._lock:
            for r in ranks:
                self.failed.pop(r, None)

    def _on_event(self, topic: str, payload: dict[str, Any]) -> None:
        if topic == "node_lost":
            ranks = [int(r) for r in payload.get("ranks", []) if isinstance(r, int)]
            how = "node_lost"
        else:
            rank = payload.get("rank")
            if not isinstance(rank, int):
                return
            ranks = [rank]
            how = str(payload.get("reason") or "exited")
        if not ranks:
            return
        with self._lock:
            for r in ranks:
                self.failed.setdefault(r, how)
            comms = list(self._comms)
            me = self.global_rank in ranks
            if me:
                self.expelled = how
            self._changed.notify_all()
        if how == LEFT and not me:
            return
        for comm in comms:
            if me:
                comm.expel(how)
            else:
                comm.notify_peer_failure(ranks, how)

    def _on_control_lost(self, error: Exception) -> None:
        """The control plane is unreachable: failures can no longer be detected or agreed on.
        Every watched communicator breaks with a clear error instead of hanging later."""
        message = self._lost_message(error)
        with self._lock:
            comms = list(self._comms)
            if self.control_lost is None:
                self.control_lost = message
            self._changed.notify_all()
        for comm in comms:
            comm.control_plane_lost(message)

    def _lost_message(self, error: Exception) -> str:
        addr = getattr(self._client, "address", "?")
        return (
            f"the control plane at {addr} is unreachable ({error}); it is the job's single point of "
            "failure (its host, the rendezvous agent, is gone): exit and restart the job"
        )

    def explain_connection_loss(self, members: list[int], wait_s: float) -> tuple[str, Any] | None:
        """Why did the engine lose a connection to one of ``members`` (global ranks)?

        An engine only sees a closed socket; the control plane knows more. Returns
        ``("failed", {rank: how})`` once a member is reported failed, ``("control_lost", message)``
        if the control plane itself is gone (a peer that lost it exits too, so its socket closes
        first: the root cause is the control plane, not the peer), or ``None`` if neither is
        known within ``wait_s`` seconds."""
        deadline = time.monotonic() + wait_s
        verdict = self._verdict(members)
        if verdict is not None:
            return verdict
        try:
            self._client.ping(timeout=max(0.05, wait_s))
        except Exception as e:  # noqa: BLE001 - any failure to reach the server means it is gone
            # This op's verdict only: the subscription decides for the whole process. A server
            # whose process runs on this host is starved, not gone: wait for a verdict instead.
            if self._host_running is None or not self._host_running():
                return ("control_lost", self._lost_message(e))
        with self._lock:
            while True:
                verdict = self._verdict_locked(members)
                remaining = deadline - time.monotonic()
                if verdict is not None or remaining <= 0:
                    return verdict
                self._changed.wait(remaining)

    def _verdict(self, members: list[int]) -> tuple[str, Any] | None:
        with self._lock:
            return self._verdict_locked(members)

    def _verdict_locked(self, members: list[int]) -> tuple[str, Any] | None:
        failed = {r: self.failed[r] for r in members if r in self.failed}
        if failed:
            return ("failed", failed)
        if self.control_lost is not None:
            return ("control_lost", self.control_lost)
        return None

    def open_communicators(self) -> list[str]:
        """Names of the watched communicators that peers may still wait for this rank in: all
        but those it finalized, that a shrink replaced, or that it was expelled from."""
        with self._lock:
            comms = list(self._comms)
        return [c.name for c in comms if c.state not in _CLOSED]

    def stop(self) -> None:
        """Stop heartbeats and the subscription (``atexit``). The heartbeat is deregistered (a
        clean exit is not a failure) unless a communicator is still open: the peers may still
        wait for this rank in it, so it leaves the way ``os._exit`` does, registered: the
        launcher that sees the exit publishes it as gone (reason ``left``, under
        ``--on-failure shrink``), and a control plane hosted without the launcher reports its
        silence (reason ``heartbeat``), so that survivors' agreements and shrinks stop waiting
        for it."""
        try:
            if self._heartbeat:
                self._heartbeat = False
                self._client.heartbeat_stop(f"rank/{self.global_rank}", timeout=self._deregister_s,
                                            deregister=not self.open_communicators())
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
        try:
            self._sub.close()
        except Exception:  # noqa: BLE001
            pass


class _MonitorRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._monitors: dict[int, FailureMonitor] = {}

    def for_store(self, store: Any, global_rank: int, until: float | None = None) -> FailureMonitor | None:
        """The monitor of a control-plane store (``None`` for other stores: no event bus); one
        started now is started by ``until`` (``time.monotonic()``) or raises."""
        client = getattr(store, "client", None)
        if client is None or not hasattr(client, "subscribe"):
            return None
        with self._lock:
            mon = self._monitors.get(id(client))
            if mon is None:
                mon = FailureMonitor(client, global_rank, until)
                self._monitors[id(client)] = mon
            return mon


MONITORS = _MonitorRegistry()
