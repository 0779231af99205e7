"""``CommCore``: the state and machinery behind the ``TorchComm`` facade.

It owns the engine, the lifecycle (:mod:`torchcomms.core.state`), the ops in flight
(:mod:`torchcomms.core.watchdog`) and the hooks; it is the ``WorkOwner`` every ``TorchWork``
reports to, and what the failure monitor and the recovery modules act on. Its attributes are
shared with those modules by design; users only see ``TorchComm``.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

from torchcomms.backends.base import TorchCommBackend
from torchcomms.core import error_map
from torchcomms.core.busy_memory import BusyMemory
from torchcomms.core.errors import CommAbortedError, CommArgumentError, CommError, CommTimeoutError, PeerFailureError
from torchcomms.core.names import NAMES
from torchcomms.core.op import OpRecord
from torchcomms.core.state import ABORTED_STATES, CommState, Lifecycle
from torchcomms.core.types import CommOptions, WorkStatus
from torchcomms.core.validation import Checker
from torchcomms.core.watchdog import Watchdog
from torchcomms.core.work import TorchWork

S = CommState


class PreflightCheck(Protocol):
    """A check every rank runs before a collective (the collective check of ``recovery``);
    ``order`` is held from a collective's sequence number to its engine call."""

    order: threading.RLock

    def run(self, rec: OpRecord, deadline: float) -> tuple[str, list[int]] | None: ...

    def note_counts(self, op_id: int, send: list[int], receive: list[int]) -> None: ...

    def close(self, abort: bool) -> None: ...


class CommCore:
    """One communicator's engine, state, ops in flight and hooks (see the module docstring)."""

    def __init__(self, backend: TorchCommBackend, options: CommOptions, store: Any) -> None:
        ctx = backend.ctx
        self.options = options
        self.store = store
        self.name = ctx.name
        self.device = ctx.device
        self.backend_name = backend.backend_name
        self.timeout_s = options.timeout.total_seconds()
        self.hints = dict(options.hints)
        self.pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self.post_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self.abort_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self.observers: list[Any] = []
        self.lock = threading.Lock()
        self.life = Lifecycle(self.name)
        self.watchdog = Watchdog(self.name, self.lock, self.expire, lambda: self.life.retired, lambda: self.timeout_s)
        #: synchronous ops waiting in the engine before they enter the watchdog's table (their first
        #: wait slice, see ``dispatch._wait_in_engine``): :meth:`in_flight_locked` counts them in,
        #: so that breaks, aborts and ``finalize`` treat them as the table's. A set's
        #: ``add``/``discard`` are each one step under the GIL: no lock on the hot path.
        self.engine_waits: set[TorchWork] = set()
        self.broken: CommError | None = None
        self.children: list[weakref.ref] = []
        self.monitor: Any = None  # FailureMonitor, when the store is the control plane's
        self.epoch = 0
        self.failed_global: dict[int, str] = {}
        self.init_handle: str | None = None
        self.reconf_work: TorchWork | None = None  # the reconfigure whose engine may still be bound
        self.base_prefix = ctx.store_prefix  # reconfigurations key off this, whatever came before
        self.check_engines = 0  # collective-check engines built so far (their rendezvous prefixes)
        self.signatures: PreflightCheck | None = None
        self.agree_rounds: dict[str, int] = {}  # agree() calls so far, per store prefix (engine)
        self.bind_engine(backend)
        NAMES.bind(self.name, self)

    def bind_engine(self, backend: TorchCommBackend) -> None:
        """Run on ``backend`` from now on: its members, numbering and capabilities."""
        ctx = backend.ctx
        self.backend = backend
        self.ctx = ctx
        self.rank, self.size = ctx.rank, ctx.size
        self.global_ranks = ctx.global_ranks or tuple(range(ctx.size))
        caps = backend.capabilities
        self.checker = Checker(self.name, self.rank, self.size, self.device, caps.dtypes, caps.bitwise_ops,
                               backend.backend_name, caps.recv_any_source, caps.complex_product)
        self.current_stream_sync = caps.current_stream_sync  # launch(..., async_op=) (see dispatch)
        #: the memory of asynchronous ops in flight, where the engine does not order ops itself,
        #: and its table (``busy_ops``: always empty where ``busy`` is None)
        self.busy = None if caps.orders_ops_on_shared_memory else BusyMemory()
        self.busy_ops = {} if self.busy is None else self.busy.ops
        self.seq = itertools.count(1)
        self.p2p_seq = itertools.count(1)
        self.last_seq = 0
        self.abort_hooks_ran = False  # on this engine (a reconfigured communicator can break anew)

    @property
    def state(self) -> CommState:
        return self.life.state

    def where(self, rec: OpRecord | None = None, op: str | None = None) -> dict[str, Any]:
        """The location fields of an error about ``rec`` (or about the op named ``op``)."""
        if rec is None:
            return dict(comm=self.name, op=op)
        return dict(comm=self.name, op=str(rec.name), seq=rec.seq)

    # --- WorkOwner: what every TorchWork reports to ----------------------------------------
    def translate_error(self, error: BaseException, record: OpRecord) -> CommError:
        kind = "" if isinstance(error, CommError) else self.backend.classify_error(error)
        return error_map.translate_engine_error(error, kind, record.timeout_s, self.where(record),
                                                self.global_ranks, self.monitor)

    def work_ended(self, work: TorchWork, exc: CommError | None) -> None:
        if work.tracked:
            self.watchdog.forget(work)
        if self.busy_ops:
            self.busy.release(work)  # type: ignore[union-attr]
        for hook in tuple(self.post_hooks.values()) if self.post_hooks else ():
            try:
                hook(work.record.op_id, work.record)
            except Exception as e:  # noqa: BLE001 - a faulty hook must not kill the engine thread
                print(f"torchcomms: post-hook {hook!r} raised {e!r}", file=sys.stderr)
        if exc is not None and not isinstance(exc, CommArgumentError):
            self.mark_broken(exc)

    def expire(self, work: TorchWork) -> None:
        if work.status is not WorkStatus.INPROGRESS:
            return
        rec = work.record
        work.finish(WorkStatus.TIMEDOUT, CommTimeoutError(
            f"did not complete within {rec.timeout_s:g} s", timeout_s=rec.timeout_s, missing_ranks=None,
            ranks=[rec.peer] if rec.peer is not None else None, **self.where(rec)))

    # --- refusing and failing ops ----------------------------------------------------------
    def refusal(self, name: Any) -> CommAbortedError:
        """Why an op named ``name`` cannot start in the current state."""
        where = dict(comm=self.name, op=str(name))
        state = self.life.state
        if state is S.BROKEN and self.broken is not None:
            return CommAbortedError(f"communicator is broken by an earlier failure ({self.broken}); "
                                    "recover it with shrink() or create a new one", **where)
        if state is S.SHRUNK:
            return CommAbortedError("communicator was shrunk; use the communicator shrink() returned", **where)
        if state is S.EXPELLED:
            return CommAbortedError("this rank was declared failed and excluded from the job's communicators; "
                                    "it cannot rejoin", **where)
        return CommAbortedError(f"communicator is {state}", **where)

    def in_flight_locked(self) -> list[TorchWork]:
        """Every op in flight (the caller holds ``lock``): the watchdog's table and the
        synchronous ops still in their first engine wait slice. ``finalize`` waits for them all:
        releasing the engine under one would block in gloo's destructor for as long as the op
        (for ever if its peer never comes), where the op itself ends at its deadline and
        breaks the communicator, which then aborts the engine instead."""
        works = self.watchdog.pending_locked()
        works += [w for w in list(self.engine_waits) if not w.tracked]  # the table's are listed
        return works

    def fail_works(self, works: list[TorchWork], error: Callable[[OpRecord], CommError],
                   state: str | None = None) -> None:
        """End each of ``works`` (outside the lock) with ``error(record)``."""
        for w in works:
            w.finish(WorkStatus.ERROR, error(w.record), state=state)

    def mark_broken(self, cause: CommError) -> None:
        """A timeout or failure broke the communicator: fail every other in-flight op fast."""
        with self.lock:
            if self.broken is not None or not self.life.can(S.BROKEN):
                return
            self.broken = cause
            self.life.move(S.BROKEN)
            others = self.in_flight_locked()
        self.fail_works(others, lambda rec: error_map.in_flight_error(cause, self.where(rec)))
        if isinstance(cause, PeerFailureError):
            self.revoke_engines()
        self.run_abort_hooks()
        if self.options.abort_process_on_timeout_or_error:
            print(f"torchcomms: {cause}; abort_process_on_timeout_or_error is set, exiting", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)

    def run_abort_hooks(self) -> None:
        """The abort hooks, once per engine: at the first of breaking, being expelled and aborting."""
        if self.abort_hooks_ran:
            return
        self.abort_hooks_ran = True
        for hook in list(self.abort_hooks.values()):
            try:
                hook()
            except Exception as e:  # noqa: BLE001
                print(f"torchcomms: abort hook {hook!r} raised {e!r}", file=sys.stderr)

    # --- failure events (from the failure monitor, or the user) ----------------------------
    def notify_peer_failure(self, failed_global_ranks: list[int], detected_by: str) -> None:
        """Job ranks failed: if any is a member, every in-flight op ends with
        ``PeerFailureError`` at once and the communicator is broken."""
        members = [self.global_ranks.index(g) for g in failed_global_ranks if g in self.global_ranks]
        if not members or self.life.retired:
            return
        for g in failed_global_ranks:
            self.failed_global.setdefault(g, detected_by)
        self.mark_broken(PeerFailureError("peer failure reported", failed_ranks=members, detected_by=detected_by,
                                          comm=self.name))

    def control_plane_lost(self, message: str) -> None:
        """The control plane is gone: break with ``CommAbortedError``."""
        if self.life.state not in (S.ACTIVE, S.BROKEN, S.RECONFIGURING):
            return
        if self.broken is None:
            self.mark_broken(CommAbortedError(message, comm=self.name))
        else:
            self.broken = CommAbortedError(message, comm=self.name)

    def expel(self, how: str) -> None:
        """This rank was declared failed (``how``): fail everything, refuse every later op."""
        with self.lock:
            if not self.life.can(S.EXPELLED):
                return
            self.life.move(S.EXPELLED)
            self.watchdog.stop_locked()
            pending = self.in_flight_locked()
        self.fail_works(pending, lambda rec: CommAbortedError(
            f"this rank was declared failed ({how}) and excluded", **self.where(rec)), state="aborted")
        self.run_abort_hooks()
        self.close_engines(abort=True)

    def known_failures(self) -> dict[int, str]:
        """Job ranks (global) known to have failed, each with how it was seen to fail."""
        failed = self.monitor.known_failures() if self.monitor is not None else {}
        failed.update(self.failed_global)
        return failed

    def agreement_error(self, error: Exception, secs: float, where: dict[str, Any]) -> CommError:
        """The typed error of an agreement over this communicator's store that failed with
        ``error`` (``secs``: its timeout)."""
        return error_map.agreement_error(error, self.ctx.store, secs, where,
                                         self.monitor.control_lost if self.monitor is not None else None)

    # --- lifecycle -------------------------------------------------------------------------
    def revoke_engines(self) -> None:
        """A peer failure broke this communicator: its engines fail the peers' ops now, so that
        a survivor blocked on this rank (not on the failed one) does not wait for its deadline."""
        if self.signatures is not None:
            self.signatures.revoke()
        self.backend.revoke()

    def close_engines(self, abort: bool) -> None:
        """Release (or abandon, after a failure) the engine and the collective check's."""
        if self.signatures is not None:
            self.signatures.close(abort)
        if abort:
            self.backend.abort()
        else:
            self.backend.finalize()

    def finalize(self) -> None:
        if self.life.retired:
            self.release()
            return
        if self.life.state is S.ACTIVE:
            with self.lock:
                pending = self.in_flight_locked()
            for w in pending:
                try:
                    w.wait_blocking()
                except CommError:
                    pass
        self.close_engines(abort=self.life.state is not S.ACTIVE)
        with self.lock:
            if self.life.can(S.FINALIZED):
                self.life.move(S.FINALIZED)
        self.release()
        if self.monitor is not None:
            self.monitor.finalized(self)  # the last one: this rank leaves cleanly

    def abort(self) -> None:
        revoke = self.options.enable_reconfigure
        with self.lock:
            if self.life.state in ABORTED_STATES or self.life.state is S.FINALIZED:
                return
            retired = not self.life.can(S.ABORTED)  # shrunk or expelled: ended already
            if not retired:
                self.life.move(S.REVOKED if revoke else S.ABORTED)
                pending = self.in_flight_locked()
                if self.reconf_work is not None:  # a reconfigure in progress never binds its engine now
                    pending.append(self.reconf_work)
                    self.reconf_work = None
        if retired:
            self.release()
            return
        self.fail_works(pending, lambda rec: CommAbortedError("communicator aborted", **self.where(rec)),
                        state="aborted")
        self.run_abort_hooks()
        try:
            self.close_engines(abort=True)
        except Exception:  # noqa: BLE001 - abort never raises
            pass
        if not revoke:  # a revoked communicator can still be reconfigured
            self.release()  # (and its watchdog ends)

    def retire(self, to: CommState) -> None:
        """Move to a state it never leaves (shrunk), ending the watchdog."""
        with self.lock:
            self.life.move(to)
            self.watchdog.stop_locked()

    def release(self) -> None:
        NAMES.release(self.name, self)
        with self.lock:
            self.watchdog.stop_locked()

    # --- derived communicators -------------------------------------------------------------
    def derived_options(self, hints: dict[str, str]) -> CommOptions:
        """This communicator's options, with its current timeout, for one derived from it."""
        return dataclasses.replace(self.options, timeout=timedelta(seconds=self.timeout_s), hints=dict(hints))

    def adopt(self, child: Any, child_core: CommCore) -> None:
        """Hand this communicator's failure monitor and observers to ``child`` (a ``TorchComm``
        derived from it, over ``child_core``)."""
        self.children.append(weakref.ref(child))
        if self.monitor is not None and child_core.monitor is None:
            self.monitor.watch(child_core)
        for obs in list(self.observers):
            child.add_observer(obs)
            on_new = getattr(obs, "on_new_comm", None)
            if on_new is not None:
                on_new(child)
