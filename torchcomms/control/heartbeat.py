"""Heartbeats a client sends for a member (``"rank/3"``, ``"node/1"``): one beat every
interval from a background thread, on a socket of its own."""

from __future__ import annotations

import logging
import threading
from typing import Any

from .connection import Channel, Connection
from .errors import ControlClosedError, ControlError

__all__ = ["HeartbeatSender", "heartbeat_budget"]

_log = logging.getLogger("torchcomms.control.client")


def heartbeat_budget(interval: float) -> float:
    """How long one heartbeat every ``interval`` seconds waits for the server's answer (a
    server that cannot answer within that is failing the member's heartbeats)."""
    return max(4 * interval, 1.0)


class HeartbeatSender:
    """Heartbeats of one member, sent every ``interval`` seconds from a thread of their own."""

    def __init__(self, connection: Connection, member: str, interval: float,
                 limit: float | None, info: dict[str, Any] | None) -> None:
        self.member = member
        self._connection = connection
        self.interval = interval
        #: seconds between beats: ``interval``, or longer when the server asks for it (it
        #: paces its members so that all together stay under its beat rate)
        self.pace = interval
        self._fields: dict[str, Any] = {"member": member, "interval": interval}
        if limit is not None:
            self._fields["limit"] = limit
        if info:
            self._fields["info"] = info
        self._stop = threading.Event()
        #: the last beat went unanswered (set and cleared by the heartbeat thread only)
        self.failing = False
        self._thread = threading.Thread(target=self._run, name=f"torchcomms-heartbeat-{member}",
                                        daemon=True)

    def beat_once(self, budget: float | None = None) -> None:
        """Send one beat now (waiting ``budget`` seconds, default the connection's timeout)."""
        self._paced(self._connection.call(
            "heartbeat", self._fields,
            budget=self._connection.timeout if budget is None else budget))

    def _paced(self, reply: Any) -> None:
        asked = reply.get("interval") if isinstance(reply, dict) else None
        if isinstance(asked, (int, float)) and not isinstance(asked, bool):
            self.pace = min(max(self.interval, float(asked)), 3600.0)

    @property
    def beat_budget(self) -> float:
        """How long one beat waits for the server's answer."""
        return heartbeat_budget(self.interval)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(2.0)

    def _run(self) -> None:
        client = self._connection
        channel: Channel | None = None
        while not self._stop.wait(self.pace):
            try:
                if channel is None:
                    channel = client.new_channel()
                self._paced(client.call("heartbeat", self._fields, budget=self.beat_budget,
                                        channel=channel, stop=self._stop))
                self.failing = False
            except ControlClosedError:
                break
            except ControlError as exc:
                if channel is not None:
                    client.discard_channel(channel)
                    channel = None
                if not self.failing:
                    self.failing = True
                    _log.warning("heartbeat for %s failed: %s", self.member, exc)
        if channel is not None:
            client.discard_channel(channel)
