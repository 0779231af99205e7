"""Failure detection without the control plane: through the job's store.

Started by ``new_comm`` for a communicator whose store is not the control plane's (env vars and
a TCPStore, or a store passed in). One watch per process and store; it plays the failure
monitor's part (``watch``, ``known_failures``, ``explain_connection_loss``):

* Each rank publishes who it is (host, boot, pid namespace, pid) under ``<prefix>/proc/<rank>``.
* A light thread looks, every ``POLL_S``, at (1) the processes of the peers on its own host
  (``/proc/<pid>``: gone or a zombie is dead; a stopped one is not), and (2) one counter key of
  the store, ``<prefix>/failed/count``, that changes when any rank publishes a failure.
* A rank that finds a peer dead publishes ``<prefix>/failed/<rank>`` (how it was found; the
  first publisher wins, compare-and-set) and bumps the counter; every watch that sees the
  counter change reads the new keys and breaks its communicators with ``PeerFailureError``
  naming the failed rank. Shrink's survivor agreement then leaves those ranks out.
* A rank that leaves cleanly says so first: ``<prefix>/done/<rank>`` is written (and read back,
  so it is in the store before the process ends) when its last watched communicator is
  finalized and when its interpreter exits normally (not through an uncaught exception). A
  peer whose process is gone with that key present left; it is not failed. A rank that leaves
  with ``os._exit`` without finalizing, or is killed, is failed.

What it cannot do (see INTERNALS, "Failure detection without the launcher"): a rank whose host
has no other rank of the job is found failed only by its peers' engines (a connection reset,
then ``PeerFailureError`` without the rank's name) or their timeouts; and with a store hosted
in a rank's process (torchrun/env vars: rank 0 hosts the TCPStore) the death of that rank takes
the store with it, so nothing is published or agreed on afterwards: shrink then fails with an
error that says so.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from torchcomms.config import settings
from torchcomms.control.host_process import process_state
from torchcomms.core.store_calls import describe_store

if TYPE_CHECKING:
    from torchcomms.core.comm_core import CommCore

#: How often the watch thread looks at its peers' processes and the store's failure counter.
POLL_S = 0.05
#: How long finalize or exit waits for this rank's ``done`` key to be stored (and read back).
#: Answered in a round trip or two; a store that does not answer by then (its host stopped)
#: cannot tell anybody anything, and finalize and exit do not wait for it.
LEAVE_WAIT_S = 0.5
#: At exit, how long the watch thread's store calls in progress are waited for at most, and
#: after how long in one look a call is taken for blocked on a store that does not answer.
EXIT_WAIT_S = 2.0
STUCK_S = 1.0


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _identity() -> dict[str, Any]:
    """This process as peers on the same host can find it: host, boot id, pid namespace, pid."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    return {"host": socket.gethostname(), "boot": _read("/proc/sys/kernel/random/boot_id"), "ns": ns,
            "pid": os.getpid()}


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` of this host (and pid namespace) is dead: gone, or a zombie."""
    state = process_state(pid)
    if state is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return not os.path.isdir("/proc/self")  # no /proc: alive as far as we can tell
    return state in ("Z", "X", "x")


class StoreWatch:
    """Routes failures found through the store (or on this host) to this process's
    communicators; see the module docstring."""

    client = None  # no control plane: nothing to publish membership to

    def __init__(self, store: Any, global_rank: int, world: int,
                 on_end: Callable[[StoreWatch], None] | None = None) -> None:
        self.global_rank = global_rank
        self.world = world
        self._store = store
        self._prefix = f"torchcomms/{settings().job_id}/liveness"
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._comms: weakref.WeakSet[CommCore] = weakref.WeakSet()
        self.failed: dict[int, str] = {}
        self.control_lost: str | None = None  # the store's host is gone (then set, for errors)
        self.attribution_wait_s = settings().failure_attribution_s
        self._me = _identity()
        self._local: dict[int, int] = {}  # peers on this host: rank -> pid
        self._unknown = set(range(world)) - {global_rank}  # peers whose identity is not read yet
        self._seen_count = 0
        self.exited: set[int] = set()  # peers whose process is gone after they said they leave
        self._left = False  # this rank's done key is written (cleared when it is in use again)
        self._leave_asked = False
        self._rejoined = False
        self._busy_since: float | None = None  # when the thread's look in progress began
        self._published = False  # this rank's identity is in the store
        self._claimed = False  # the first watch() starts the thread
        self._wake = threading.Condition(self._lock)  # wakes the thread before its next look
        self._errors_at_start = getattr(sys, "last_value", None)  # an uncaught exception sets it
        self._stop = threading.Event()
        self._on_end = on_end
        self._thread = threading.Thread(target=self._run, name="torchcomms-store-watch", daemon=True)

    # --- the failure-monitor interface ----------------------------------------------------
    @property
    def store(self) -> Any:
        return self._store

    def watch(self, comm: CommCore) -> None:
        with self._lock:
            self._comms.add(comm)
            self._rejoined = self._left  # in use again after it left: not done any more
            start = not self._claimed and not self._stop.is_set()
            self._claimed = True
        if start:
            # Before new_comm returns, not on the thread: a rank killed before the thread ran
            # would never be found (peers find only ranks whose identity they read).
            try:
                self._store.set(self._proc_key(self.global_rank), json.dumps(self._me).encode())
                self._published = True
            except Exception:  # noqa: BLE001 - the thread tries again (and finds the store's loss)
                pass
            self._thread.start()
            atexit.register(self._at_exit)
        comm.monitor = self

    def finalized(self, comm: CommCore) -> None:
        """``comm`` was finalized: once no watched communicator is in use, this rank leaves
        cleanly (see :meth:`leave`)."""
        if not self._watching():
            self.leave()

    def leave(self) -> None:
        """Write ``done/<this rank>`` and read it back, so that peers that see this process
        gone take it for a clean exit. The watch thread writes it (no second caller on the
        store's client, no thread started at exit); this waits for it at most ``LEAVE_WAIT_S``.
        A communicator watched after this deletes the key (the thread does, on its next look)."""
        if self._left or self.control_lost is not None:
            return
        if self._thread.ident is None or not self._thread.is_alive():
            try:  # no thread to ask: a set alone (it does not wait for the store's answer)
                self._store.set(self._done_key(self.global_rank), b"1")
            except Exception:  # noqa: BLE001 - nobody to tell: peers may take it for dead
                return
            self._left = True
            return
        with self._lock:
            self._leave_asked = True
            self._wake.notify_all()
            self._changed.wait_for(lambda: self._left or self._stop.is_set(), LEAVE_WAIT_S)

    def _done_key(self, rank: int) -> str:
        return f"{self._prefix}/done/{rank}"

    def _proc_key(self, rank: int) -> str:
        return f"{self._prefix}/proc/{rank}"

    def _at_exit(self) -> None:
        """At interpreter exit: leave cleanly, unless an uncaught exception ends the process
        (a failure its peers must learn of); then stop the thread."""
        if getattr(sys, "last_value", None) is self._errors_at_start:
            self.leave()
        self.stop()

    def known_failures(self) -> dict[int, str]:
        with self._lock:
            return dict(self.failed)

    def explain_connection_loss(self, members: list[int], wait_s: float) -> tuple[str, Any] | None:
        """Who among ``members`` failed, once known (by this host's look at its peers or a
        published failure) within ``wait_s``; ``None`` otherwise."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            while True:
                failed = {r: self.failed[r] for r in members if r in self.failed}
                remaining = deadline - time.monotonic()
                if failed:
                    return ("failed", failed)
                if remaining <= 0 or self._stop.is_set():
                    return None
                self._changed.wait(min(remaining, POLL_S))

    def stop(self) -> None:
        """End the thread, waiting for its store call in progress (at most ``EXIT_WAIT_S``; a
        call answered ends in a round trip). One blocked for ``STUCK_S`` already, on a stopped
        store host, is left: a TCPStore call waits in C++ without the interpreter, so exit does
        not wait for it (see ``store_calls``)."""
        self._stop.set()
        with self._lock:
            self._wake.notify_all()
        if self._thread.ident is None or self._thread is threading.current_thread():
            return
        # Wait for the store call in progress: a thread that returns from the store's C++ code
        # while the interpreter finalizes aborts the process (see ``store_calls``). One that has
        # waited ``STUCK_S`` already is on a store that does not answer: left, it stays blocked.
        until = time.monotonic() + EXIT_WAIT_S
        while self._thread.is_alive() and time.monotonic() < until:
            since = self._busy_since
            if since is not None and time.monotonic() - since > STUCK_S:
                return
            self._thread.join(POLL_S)

    # --- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._store.delete_key(self._done_key(self.global_rank))  # in use (again)
            if not self._published:
                self._store.set(self._proc_key(self.global_rank), json.dumps(self._me).encode())
        except Exception as e:  # noqa: BLE001 - no store: nothing to watch through
            if isinstance(e, dist.DistNetworkError):
                self._store_lost(e)
            return self._end()
        while not self._stop.is_set():
            self._busy_since = time.monotonic()
            try:
                if self._leave_asked:
                    self._write_done()
                if not self._watching():
                    break
                if self._rejoined:  # a communicator is watched again: this rank is not done
                    with self._lock:
                        self._rejoined = self._left = False
                    self._store.delete_key(self._done_key(self.global_rank))
                self._learn_identities()
                for rank, pid in list(self._local.items()):
                    if rank not in self.failed and process_gone(pid):
                        if self._store.check([self._done_key(rank)]):
                            del self._local[rank]  # it said it leaves: a clean exit
                            self.exited.add(rank)
                        else:
                            self._publish(rank, "process_gone")
                count = int(self._store.add(f"{self._prefix}/failed/count", 0))
                if count != self._seen_count:
                    self._seen_count = count
                    self._read_failures()
            except dist.DistNetworkError as e:  # the store's host is gone: nothing more to learn
                self._store_lost(e)
                break
            except Exception:  # noqa: BLE001 - a slow or confused store: look again next time
                pass
            self._busy_since = None
            with self._lock:
                if not self._leave_asked and not self._stop.is_set():
                    self._wake.wait(POLL_S)
        self._end()

    def _write_done(self) -> None:
        key = self._done_key(self.global_rank)
        self._store.set(key, b"1")
        self._store.check([key])  # a round trip: the set is in the store before a waiter goes on
        with self._lock:
            self._leave_asked = False
            self._left = True
            self._changed.notify_all()

    def _watching(self) -> bool:
        """Whether a communicator it watches is still in use (not ended, not collected)."""
        with self._lock:
            return any(not c.life.retired for c in list(self._comms))

    def _end(self) -> None:
        self._stop.set()
        with self._lock:
            self._changed.notify_all()
        if self._on_end is not None:
            self._on_end(self)

    def _learn_identities(self) -> None:
        """Read the identities peers have published so far (each peer's once)."""
        if not self._unknown:
            return
        ready = [r for r in sorted(self._unknown) if self._store.check([self._proc_key(r)])]
        if not ready:
            return
        for r, raw in zip(ready, self._store.multi_get([self._proc_key(r) for r in ready])):
            info = json.loads(bytes(raw).decode())
            if all(info.get(k) == self._me[k] for k in ("host", "boot", "ns")) and isinstance(info.get("pid"), int):
                self._local[r] = info["pid"]
            self._unknown.discard(r)

    def _publish(self, rank: int, how: str) -> None:
        """Publish ``rank`` failed (first publisher wins) and tell this process's communicators."""
        self._learn(rank, how)  # first: a store that died with that rank cannot tell anyone
        key = f"{self._prefix}/failed/{rank}"
        mine = json.dumps({"how": how, "by": self.global_rank}).encode()
        if bytes(self._store.compare_set(key, b"", mine)) == mine:
            self._store.add(f"{self._prefix}/failed/count", 1)

    def _read_failures(self) -> None:
        for r in range(self.world):
            if r == self.global_rank or r in self.failed:
                continue
            key = f"{self._prefix}/failed/{r}"
            if self._store.check([key]):
                self._learn(r, str(json.loads(bytes(self._store.get(key)).decode()).get("how", "reported")))

    def _learn(self, rank: int, how: str) -> None:
        with self._lock:
            if rank in self.failed:
                return
            self.failed[rank] = how
            comms = list(self._comms)
            self._changed.notify_all()
        for comm in comms:
            comm.notify_peer_failure([rank], how)

    def _store_lost(self, error: BaseException) -> None:
        with self._lock:
            self.control_lost = (
                f"{describe_store(self._store)} is gone ({error}): without torchcomms-run, failures are found "
                "and agreed on through the job's store, so a store hosted in a rank's process (torchrun/env vars: "
                "rank 0 hosts it) dies with that rank and nothing can be recovered after; to shrink after any "
                "rank's death pass store= a TCPStore hosted outside the ranks, or run under torchcomms-run")
            self._changed.notify_all()


class _WatchRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[int, StoreWatch] = {}

    def for_store(self, store: Any, global_rank: int, world: int) -> StoreWatch | None:
        """The watch of ``store`` (made once per process); ``None`` for a store that cannot
        count (a ``HashStore`` of one process has no peers to watch)."""
        if store is None or isinstance(store, dist.HashStore) or not hasattr(store, "compare_set"):
            return None
        with self._lock:
            watch = self._watches.get(id(store))
            if watch is None:
                watch = StoreWatch(store, global_rank, world, on_end=self._ended)
                self._watches[id(store)] = watch
            return watch

    def _ended(self, watch: StoreWatch) -> None:
        with self._lock:
            if self._watches.get(id(watch.store)) is watch:
                del self._watches[id(watch.store)]


WATCHES = _WatchRegistry()
