"""An event subscription: a thread that long-polls the server's event bus and hands each
new event to a callback, riding out slow replies and reporting a lost server once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .connection import REPLY_GRACE_S, Channel, Connection
from .errors import ControlClosedError, ControlError
from .events import Event, EventSchemaError

__all__ = ["Subscription", "EventCallback", "DEFAULT_CONTROL_LOST_S"]

_SUBSCRIBE_POLL_S = 5.0
#: How long a subscription goes unanswered before the server is taken for lost (``on_error``):
#: one slow reply on a starved box is not a lost control plane.
DEFAULT_CONTROL_LOST_S = 8.0

EventCallback = Callable[[str, dict[str, Any]], None]
_log = logging.getLogger("torchcomms.control.client")


class Subscription:
    """A running subscription; events are delivered to the callback on its own thread."""

    def __init__(self, connection: Connection, topics: list[str] | None, callback: EventCallback,
                 since: int, on_error: Callable[[ControlError], None] | None,
                 lost_after: float = DEFAULT_CONTROL_LOST_S,
                 on_close: Callable[[Subscription], None] | None = None,
                 host_running: Callable[[], bool] | None = None) -> None:
        self._connection = connection
        self._on_close = on_close
        self.topics = topics
        self._callback = callback
        self._on_error = on_error
        self.lost_after = lost_after
        #: the control plane's host process is running (a server on this host): an outage is
        #: then slowness however long it lasts; only a closed connection or a stopped or
        #: vanished host is a loss
        self._host_running = host_running
        self.last_seq = since
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchcomms-control-subscription",
                                        daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def close(self, timeout: float = 2.0) -> None:
        """Stop delivering events (idempotent; safe to call from the callback)."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if self._on_close is not None:
            self._on_close(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        client = self._connection
        channel: Channel | None = None
        failing_since: float | None = None  # first unanswered poll of the current outage
        slow_noted = 0.0  # when a running host's silence was last logged
        reported = False
        while not self._stop.is_set():
            try:
                if channel is None:
                    channel = client.new_channel()
                fields: dict[str, Any] = {"since": self.last_seq, "timeout": _SUBSCRIBE_POLL_S}
                if self.topics is not None:
                    fields["topics"] = self.topics
                items = client.call("events", fields, budget=_SUBSCRIBE_POLL_S + REPLY_GRACE_S,
                                     channel=channel, stop=self._stop)
                if failing_since is not None:
                    _log.info("event subscription answered again after %.1f s",
                              time.monotonic() - failing_since)
                failing_since, reported = None, False
            except ControlClosedError:
                break
            except ControlError as exc:
                # The server closed the connection (its process is gone): lost at once. No
                # reply in time is only slowness until it lasts ``lost_after``.
                closed = channel is not None and channel.watch.lost
                if channel is not None:
                    client.discard_channel(channel)
                    channel = None
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    _log.info("event subscription: no answer yet (%s); retrying", exc)
                if not reported and (closed or now - failing_since >= self.lost_after):
                    if not closed and self._host_running is not None and self._host_running():
                        if now - slow_noted >= self.lost_after:  # starved, not lost: say so now and then
                            slow_noted = now
                            _log.warning("event subscription unanswered for %.1f s; the control plane's "
                                         "process is running (a starved node): waiting", now - failing_since)
                    else:
                        reported = True
                        _log.warning("event subscription interrupted for %.1f s: %s",
                                     now - failing_since, exc)
                        if self._on_error is not None:
                            try:
                                self._on_error(exc)
                            except Exception:  # noqa: BLE001 - user code must not kill the thread
                                _log.exception("subscription on_error callback failed")
                self._stop.wait(0.5)
                continue
            if not isinstance(items, list):
                continue
            for item in items:
                try:
                    event = Event.from_wire(item)
                except EventSchemaError:
                    _log.warning("discarding a malformed event record")
                    continue
                if event.seq <= self.last_seq:
                    continue
                self.last_seq = event.seq
                if self._stop.is_set():
                    break
                try:
                    self._callback(event.topic, {**event.payload, "seq": event.seq})
                except Exception:  # noqa: BLE001 - user code must not kill the thread
                    _log.exception("event callback failed on %s #%d", event.topic, event.seq)
        if channel is not None:
            client.discard_channel(channel)
