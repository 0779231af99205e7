"""``TorchComm``: the communicator and its one dispatch path (``create.new_comm`` makes one)."""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle

from torchcomms import collective_check
from torchcomms.backends.base import ENGINE_WAIT_SLICE_S, BackendContext, EngineHandle, TorchCommBackend
from torchcomms.collective_check import SignatureCheck
from torchcomms.agreement import agree_on_survivors
from torchcomms.errors import (
    BackendError,
    CollectiveMismatchError,
    CommAbortedError,
    CommArgumentError,
    CommError,
    CommTimeoutError,
    CommTypeError,
    CommValueError,
    PeerFailureError,
)
from torchcomms.op import OpRecord
from torchcomms.store_calls import StoreNotAnswering, call_until, describe_store
from torchcomms.store_errors import store_error
from torchcomms.types import BatchP2POptions, CommOptions, OpName, P2POp, P2POpType, ReduceOp, WorkStatus
from torchcomms.validation import Checker
from torchcomms.work import TorchWork

#: the shortest sleep of a watchdog with no op in flight (a tiny default timeout must not make it spin)
_IDLE_WATCH_MIN_S = 1.0
_OP_IDS = itertools.count(1)
_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _dtype_name(dt: torch.dtype) -> str:
    """``"float32"`` for ``torch.float32``, cached (the dispatch path asks per tensor)."""
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = str(dt)[6:]
    return name


def _shapes(tensors: list[torch.Tensor]) -> list[list[int]]:
    if len(tensors) == 1:  # the common case, without a comprehension's frame
        return [list(tensors[0].shape)]
    return [list(t.shape) for t in tensors]


def _dtype_names(tensors: list[torch.Tensor]) -> list[str]:
    if len(tensors) == 1:
        return [_dtype_name(tensors[0].dtype)]
    return [_dtype_name(t.dtype) for t in tensors]


class _NameRegistry:
    """Communicator names alive in this process, and how often each name was created (so a
    re-created communicator rendezvous under fresh store keys)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, weakref.ref] = {}
        self._incarnations: dict[str, int] = {}

    def claim(self, name: str) -> int:
        with self._lock:
            ref = self._live.get(name)
            if ref is not None and ref() is not None:
                raise CommValueError(
                    f"a communicator named {name!r} already exists in this process; names must be unique "
                    "(finalize the old one first)"
                )
            n = self._incarnations.get(name, 0)
            self._incarnations[name] = n + 1
            return n

    def bind(self, name: str, comm: TorchComm) -> None:
        with self._lock:
            self._live[name] = weakref.ref(comm)

    def release(self, name: str, comm: TorchComm) -> None:
        with self._lock:
            ref = self._live.get(name)
            if ref is not None and ref() in (comm, None):
                del self._live[name]


NAMES = _NameRegistry()


def _publish_quietly(client: Any, topic: str, payload: dict[str, Any]) -> None:
    """Publish an informative event that nobody waits for; a failure to publish is ignored."""
    try:
        client.publish(topic, payload)
    except Exception:  # noqa: BLE001 - the event is informative only
        pass


def engine_error(kind: str, error: BaseException, timeout_s: float, where: dict[str, Any]) -> CommError:
    """The typed error of an engine's ``error``, as its backend classified it (``kind``:
    ``"timeout"``, ``"peer"`` or anything else); ``where`` names the comm and op."""
    msg = f"engine error: {error}".strip()
    if kind == "timeout":
        return CommTimeoutError(msg, timeout_s=timeout_s, **where)
    if kind == "peer":
        return PeerFailureError(msg, detected_by="engine", **where)
    return BackendError(msg, **where)


def _ranks_key(ranks: list[int]) -> str:
    """A short, stable key of a member list, so that disjoint groups split under the same
    name rendezvous under different store keys."""
    import hashlib

    return hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:12]


class BatchSendRecv:
    """A batch of sends and receives issued together (``comm.batch_op_create()``)."""

    def __init__(self, comm: TorchComm) -> None:
        self._comm = comm
        self.ops: list[P2POp] = []

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._comm._checker.tensor("send", "tensor", tensor)
        self._comm._checker.rank_arg("send", "dst", dst, allow_self=False)
        self.ops.append(P2POp(P2POpType.SEND, tensor, dst))

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self._comm._checker.tensor("recv", "tensor", tensor)
        self._comm._checker.rank_arg("recv", "src", src, allow_self=False)
        self.ops.append(P2POp(P2POpType.RECV, tensor, src))

    def issue(self, async_op: bool, options: BatchP2POptions | None = None) -> TorchWork:
        """Start every op of the batch; one ``TorchWork`` covers them all."""
        opts = options or BatchP2POptions()
        return self._comm._batch_p2p(self.ops, async_op, opts.hints, opts.timeout)


#: States a communicator never leaves: no op can start, every one in flight has been failed,
#: so its watchdog thread ends.
_RETIRED_STATES = frozenset({"finalized", "aborted", "shrunk", "expelled"})


class TorchComm:
    """A communicator: every operation goes through :meth:`_run`, the one dispatch path."""

    def __init__(self, backend: TorchCommBackend, options: CommOptions, store: Any) -> None:
        ctx = backend.ctx
        self._backend = backend
        self._ctx = ctx
        self._options = options
        self._store = store
        self._name = ctx.name
        self._rank = ctx.rank
        self._size = ctx.size
        self._device = ctx.device
        self._global_ranks = ctx.global_ranks or tuple(range(ctx.size))
        self._backend_name = backend.backend_name
        self._timeout_s = options.timeout.total_seconds()
        self._hints = dict(options.hints)
        caps = backend.capabilities
        self._checker = Checker(self._name, self._rank, self._size, self._device, caps.dtypes, caps.bitwise_ops)
        self._seq = itertools.count(1)
        self._p2p_seq = itertools.count(1)
        self._last_seq = 0
        self._pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._post_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._abort_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._observers: list[Any] = []
        self._lock = threading.Lock()
        self._inflight: dict[int, TorchWork] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._watchdog: threading.Thread | None = None
        self._wake = threading.Condition(self._lock)
        self._watch_until: float | None = None  # when the watchdog next wakes (None: not started)
        self._broken: CommError | None = None
        self._state = "active"  # active | broken | aborted | finalized
        self._children: list[weakref.ref] = []
        self._monitor: Any = None  # FailureMonitor, when the store is the control plane's
        self._epoch = 0
        self._failed_global: dict[int, str] = {}
        self._init_handle: str | None = None
        self._reconf_work: TorchWork | None = None  # the reconfigure whose engine may still be bound
        self._base_prefix = ctx.store_prefix  # reconfigurations key off this, whatever came before
        self._check_engines = 0
        self._signatures = self._new_signature_check()
        NAMES.bind(self._name, self)

    # ----------------------------------------------------------------------------------------
    # getters and settings
    def get_rank(self) -> int:
        return self._rank

    def get_size(self) -> int:
        return self._size

    def get_name(self) -> str:
        return self._name

    def get_device(self) -> torch.device:
        return self._device

    def get_options(self) -> CommOptions:
        return self._options

    def get_backend(self) -> str:
        return self._backend_name

    def get_backend_version(self) -> str:
        return self._backend.version()

    def get_backend_impl(self) -> Any:
        return self._backend.engine()

    def get_global_ranks(self) -> list[int]:
        """Global (job) rank of each rank of this communicator."""
        return list(self._global_ranks)

    def is_abort_supported(self) -> bool:
        return True

    def is_aborted(self) -> bool:
        return self._state in ("aborted", "revoked")

    def is_broken(self) -> bool:
        """True after a timeout or peer failure (until recovered with ``shrink``)."""
        return self._broken is not None

    def set_timeout(self, timeout: timedelta) -> None:
        secs = self._checker.timeout("set_timeout", timeout)
        if secs is None:
            raise self._checker.type_error("set_timeout", "timeout must not be None")
        self._timeout_s = secs
        self._options.timeout = timedelta(seconds=secs)

    def set_hints(self, hints: dict[str, str]) -> None:
        self._checker.hints("set_hints", hints)
        self._hints.update(hints)

    def get_hints(self) -> dict[str, str]:
        return dict(self._hints)

    # ----------------------------------------------------------------------------------------
    # hooks and observers
    def register_pre_hook(self, cb: Callable[[OpName, int, OpRecord], Any]) -> RemovableHandle:
        """``cb(name, op_id, record)`` before each op reaches the engine."""
        return self._add_hook(self._pre_hooks, cb)

    def register_post_hook(self, cb: Callable[[int, OpRecord], Any]) -> RemovableHandle:
        """``cb(op_id, record)`` when each op ends (``record.state`` says how)."""
        return self._add_hook(self._post_hooks, cb)

    def register_abort_hook(self, cb: Callable[[], Any]) -> RemovableHandle:
        """``cb()`` when the communicator aborts or breaks."""
        return self._add_hook(self._abort_hooks, cb)

    def _add_hook(self, table: OrderedDict[int, Callable[..., Any]], cb: Callable[..., Any]) -> RemovableHandle:
        if not callable(cb):
            raise CommTypeError(f"hook must be callable, got {type(cb).__name__}", comm=self._name)
        handle = RemovableHandle(table)
        table[handle.id] = cb
        return handle

    def add_observer(self, observer: Any) -> None:
        """Follow this communicator and every one split or shrunk from it later
        (``observer.on_new_comm(child)`` is called for each)."""
        self._observers.append(observer)

    def remove_observer(self, observer: Any) -> None:
        if observer in self._observers:
            self._observers.remove(observer)

    # ----------------------------------------------------------------------------------------
    # the dispatch path
    def _usable(self, name: Any) -> None:
        if self._state != "active":
            if self._broken is not None and self._state == "broken":
                raise CommAbortedError(
                    f"communicator is broken by an earlier failure ({self._broken}); "
                    "recover it with shrink() or create a new one",
                    comm=self._name,
                    op=str(name),
                )
            if self._state == "shrunk":
                raise CommAbortedError(
                    "communicator was shrunk; use the communicator shrink() returned", comm=self._name, op=str(name)
                )
            if self._state == "expelled":
                raise CommAbortedError(
                    "this rank was declared failed and excluded from the job's communicators; it cannot rejoin",
                    comm=self._name, op=str(name),
                )
            raise CommAbortedError(f"communicator is {self._state}", comm=self._name, op=str(name))

    def _run(
        self,
        name: OpName,
        async_op: bool,
        hints: dict[str, str] | None,
        timeout: Any,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
        launch: Callable[..., EngineHandle],
        args: tuple[Any, ...],
        peer: int | None = None,
        root: int | None = None,
        reduce_op: ReduceOp | None = None,
        is_p2p: bool = False,
    ) -> TorchWork:
        """Steps 2–6 of the dispatch path (step 1, validation, is done by the caller)."""
        if async_op is not True and async_op is not False:
            raise self._checker.type_error(str(name), f"async_op must be a bool, got {type(async_op).__name__}")
        timeout_s = self._checker.timeout(str(name), timeout) if timeout is not None else self._timeout_s
        if hints is not None:
            self._checker.hints(str(name), hints)
        if self._state != "active":
            self._usable(name)
        if is_p2p:
            seq = next(self._p2p_seq)
        else:
            seq = next(self._seq)
            self._last_seq = seq
        op_id = next(_OP_IDS)
        rec = OpRecord(
            self._name, self._global_ranks, self._rank, self._size, self._backend_name, name, seq, op_id,
            timeout_s, async_op, time.time_ns(), is_p2p=is_p2p, peer=peer, root=root,
            reduce_op=reduce_op.label if reduce_op is not None else None,
            input_sizes=_shapes(inputs), input_dtypes=_dtype_names(inputs),
            output_sizes=_shapes(outputs), output_dtypes=_dtype_names(outputs),
            hints=hints,
        )
        if self._pre_hooks:
            rec.extra = {"inputs": inputs, "outputs": outputs}  # for hooks that inspect data
            try:
                for hook in tuple(self._pre_hooks.values()):
                    hook(name, op_id, rec)
            finally:
                rec.extra = None  # tracing keeps records: never pin the tensors
        work = TorchWork(self, rec, time.monotonic() + timeout_s)
        rec.state = "started"
        rec.time_started_ns = time.time_ns()
        mismatch = self._compare_signatures(rec, work) if self._signatures is not None and not is_p2p else None
        try:
            handle = EngineHandle.failed(mismatch) if mismatch is not None else launch(*args)
        except CommError as e:
            handle = EngineHandle.failed(e)
        except Exception as e:  # noqa: BLE001 - the engine may throw anything
            handle = EngineHandle.failed(e)
        if not handle.is_immediate:
            self._track(work)
            if not async_op and handle.can_wait_in_engine:
                self._wait_in_engine(work, handle)
                return work
            handle.on_done(work._engine_done)
        elif handle._error is None and handle._finish is None:
            work._finish(WorkStatus.COMPLETED, None)  # ended inside the call: skip the callback chain
        else:
            handle.on_done(work._engine_done)
        if not async_op and (work._exc is not None or not work._done):
            work.wait()
        return work

    def _compare_signatures(self, rec: OpRecord, work: TorchWork) -> CommError | None:
        """The collective check (debug mode): ``None`` when every rank is making this same
        call, else the error the op ends with on every rank (see ``collective_check``)."""
        assert self._signatures is not None
        try:
            verdict = self._signatures.run(rec, work.deadline)
        except collective_check.EngineNotReady:
            return self._engine_not_built(rec, self._global_ranks, "the collective check's engine")
        except TimeoutError:
            return CommTimeoutError(
                f"did not complete within {rec.timeout_s:g} s (not every rank reached this collective)",
                timeout_s=rec.timeout_s, comm=self._name, op=str(rec.name), seq=rec.seq,
            )
        except BaseException as e:  # noqa: BLE001 - the engine may throw anything
            return self._build_error(e, rec)
        if verdict is None:
            return None
        message, ranks = verdict
        return CollectiveMismatchError(message, comm=self._name, op=str(rec.name), seq=rec.seq, ranks=ranks)

    def _new_signature_check(self) -> SignatureCheck | None:
        if self._size > 1 and collective_check.enabled(self._hints):
            return SignatureCheck(self._make_check_engine, self._size)
        return None

    def _make_check_engine(self, deadline: float) -> TorchCommBackend | None:
        """The collective check's side engine: same members, its own rendezvous prefix; built
        by ``deadline`` (``time.monotonic()``), else ``None`` (see :meth:`_build_until`)."""
        self._check_engines += 1  # every rank makes them at the same ops: the prefixes agree
        ctx = dataclasses.replace(
            self._ctx, name=f"{self._name}/check", store_prefix=f"{self._ctx.store_prefix}/check{self._check_engines}",
            timeout=timedelta(seconds=max(0.001, deadline - time.monotonic())), hints=dict(self._hints),
        )
        return self._build_until(ctx, deadline)

    def _close_engines(self, abort: bool) -> None:
        """Release (or abandon, after a failure) the engine and the collective check's."""
        if self._signatures is not None:
            self._signatures.close(abort)
        if abort:
            self._backend.abort()
        else:
            self._backend.finalize()

    def _wait_in_engine(self, work: TorchWork, handle: EngineHandle) -> None:
        """The synchronous fast path: block in the engine on the caller's thread, as c10d does,
        instead of a future callback on the engine's thread waking this one. The wait runs in
        slices so that an op ended elsewhere (deadline, peer failure, abort) is seen within one
        slice; raises the op's error like ``wait()``."""
        while work.status is WorkStatus.INPROGRESS:
            remaining = work.deadline - time.monotonic()
            if remaining <= 0:
                self._expire(work)
                break
            done, error = handle.wait_engine(min(ENGINE_WAIT_SLICE_S, remaining))
            if done:
                work._engine_done(error)
                break
        work.wait()

    def _track(self, work: TorchWork) -> None:
        work.tracked = True
        with self._lock:
            self._inflight[work.record.op_id] = work
            heapq.heappush(self._deadlines, (work.deadline, work.record.op_id))
            if self._watchdog is None:
                self._watchdog = threading.Thread(
                    target=self._watch, name=f"torchcomms-watchdog-{self._name}", daemon=True
                )
                self._watchdog.start()
            elif self._watch_until is None or work.deadline < self._watch_until:
                self._wake.notify()  # only when it would otherwise sleep past this deadline

    def _watch(self) -> None:
        """Fail works whose deadline passed, even when nobody waits on them."""
        with self._lock:
            while self._state not in _RETIRED_STATES:
                now = time.monotonic()
                expired: list[TorchWork] = []
                while self._deadlines and (
                    self._deadlines[0][0] <= now or self._deadlines[0][1] not in self._inflight
                ):
                    _, op_id = heapq.heappop(self._deadlines)
                    w = self._inflight.get(op_id)
                    if w is not None:
                        expired.append(w)
                if expired:
                    self._lock.release()
                    try:
                        for w in expired:
                            self._expire(w)
                    finally:
                        self._lock.acquire()
                    continue
                # With nothing in flight, sleep one default timeout: an op started from now on
                # with that timeout ends later, so only a shorter one needs to wake the watchdog.
                self._watch_until = (self._deadlines[0][0] if self._deadlines
                                     else now + max(self._timeout_s, _IDLE_WATCH_MIN_S))
                self._wake.wait(self._watch_until - now)

    def _work_ended(self, work: TorchWork, exc: CommError | None) -> None:
        """Called once per op from ``TorchWork`` when it reaches a terminal status."""
        if work.tracked:
            with self._lock:
                self._inflight.pop(work.record.op_id, None)
                # Deadlines of ended ops stay in the heap until the watchdog next wakes (up to a
                # timeout away); rebuild it when they dominate, so it stays O(ops in flight).
                if len(self._deadlines) > 2 * len(self._inflight) + 64:
                    self._deadlines = [(w.deadline, oid) for oid, w in self._inflight.items()]
                    heapq.heapify(self._deadlines)
        for hook in tuple(self._post_hooks.values()) if self._post_hooks else ():
            try:
                hook(work.record.op_id, work.record)
            except Exception as e:  # noqa: BLE001 - a faulty hook must not kill the engine thread
                print(f"torchcomms: post-hook {hook!r} raised {e!r}", file=sys.stderr)
        if exc is not None and not isinstance(exc, CommArgumentError):
            self._break(exc)

    def _expire(self, work: TorchWork) -> None:
        """The op's deadline passed: fail it with a ``CommTimeoutError``."""
        if work.status is not WorkStatus.INPROGRESS:
            return
        rec = work.record
        missing = self._missing_ranks(rec)
        exc = CommTimeoutError(
            f"did not complete within {rec.timeout_s:g} s",
            timeout_s=rec.timeout_s,
            missing_ranks=missing,
            comm=self._name,
            op=str(rec.name),
            seq=rec.seq,
            ranks=[rec.peer] if rec.peer is not None else None,
        )
        work._finish(WorkStatus.TIMEDOUT, exc)

    def _missing_ranks(self, rec: OpRecord) -> list[int] | None:
        """Ranks known not to have entered this op (none known without a control plane)."""
        return None

    def _translate_engine_error(self, error: BaseException, rec: OpRecord) -> CommError:
        if isinstance(error, CommError):
            return error
        kind = self._backend.classify_error(error)
        ctx: dict[str, Any] = dict(comm=self._name, op=str(rec.name), seq=rec.seq)
        if kind == "peer" and self._monitor is not None:  # the control plane may know who failed
            verdict = self._monitor.explain_connection_loss(
                list(self._global_ranks), min(self._monitor.attribution_wait_s, rec.timeout_s))
            if verdict is not None and verdict[0] == "control_lost":
                return CommAbortedError(f"{verdict[1]} (the engine then lost a peer: {error})", **ctx)
            if verdict is not None:
                failed = verdict[1]
                return PeerFailureError(
                    f"engine error: {error}".strip(),
                    failed_ranks=[self._global_ranks.index(g) for g in sorted(failed)],
                    detected_by=",".join(sorted(set(failed.values()))), **ctx)
        return engine_error(kind, error, rec.timeout_s, ctx)

    def _break(self, cause: CommError) -> None:
        """A timeout or failure broke the communicator: fail every other in-flight op fast."""
        with self._lock:
            if self._broken is not None or self._state in ("aborted", "revoked", "finalized"):
                return
            self._broken = cause
            self._state = "broken"
            others = list(self._inflight.values())
        for w in others:
            rec = w.record
            if isinstance(cause, PeerFailureError):
                exc: CommError = PeerFailureError(
                    "a peer failed while this op was in flight",
                    failed_ranks=cause.failed_ranks, detected_by=cause.detected_by,
                    comm=self._name, op=str(rec.name), seq=rec.seq,
                )
            else:
                exc = CommAbortedError(
                    f"communicator broken: {cause}", comm=self._name, op=str(rec.name), seq=rec.seq,
                )
            w._finish(WorkStatus.ERROR, exc)
        self._run_abort_hooks()
        if self._options.abort_process_on_timeout_or_error:
            print(f"torchcomms: {cause}; abort_process_on_timeout_or_error is set, exiting", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)

    def _run_abort_hooks(self) -> None:
        for hook in list(self._abort_hooks.values()):
            try:
                hook()
            except Exception as e:  # noqa: BLE001
                print(f"torchcomms: abort hook {hook!r} raised {e!r}", file=sys.stderr)

    def notify_peer_failure(self, failed_global_ranks: list[int], detected_by: str) -> None:
        """Tell the communicator that job ranks failed (from the event bus or the launcher).

        If any is a member, every in-flight op ends with ``PeerFailureError`` at once and the
        communicator is broken."""
        members = [self._global_ranks.index(g) for g in failed_global_ranks if g in self._global_ranks]
        if not members or self._state in _RETIRED_STATES:
            return
        for g in failed_global_ranks:
            self._failed_global.setdefault(g, detected_by)
        self._break(
            PeerFailureError(
                "peer failure reported", failed_ranks=members, detected_by=detected_by, comm=self._name
            )
        )

    def _control_plane_lost(self, message: str) -> None:
        """Break with ``CommAbortedError`` (called by the failure monitor)."""
        if self._state not in ("active", "broken", "reconfiguring"):
            return
        if self._broken is None:
            self._break(CommAbortedError(message, comm=self._name))
        else:
            self._broken = CommAbortedError(message, comm=self._name)

    def _expel(self, how: str) -> None:
        """This rank was declared failed (``how``): fail everything, refuse every later op."""
        with self._lock:
            if self._state in ("finalized", "expelled"):
                return
            self._state = "expelled"
            self._wake.notify_all()  # its watchdog ends
            pending = list(self._inflight.values())
        for w in pending:
            rec = w.record
            w._finish(WorkStatus.ERROR, CommAbortedError(
                f"this rank was declared failed ({how}) and excluded", comm=self._name, op=str(rec.name), seq=rec.seq,
            ), state="aborted")
        self._run_abort_hooks()
        self._close_engines(abort=True)

    # ----------------------------------------------------------------------------------------
    # recovery
    def shrink(self, timeout: timedelta | None = None) -> TorchComm:
        """Survivors agree on who is left and carry on in a new communicator (this project's
        addition to the API). Collective over the surviving ranks; returns the new communicator
        (same name, ranks renumbered in the order of the old ranks). This communicator refuses
        every later op. Raises ``CommAbortedError`` on a rank that was declared failed, and
        ``CommTimeoutError`` when the survivors' engine is not rebuilt, or the store they agree
        through does not answer, by the deadline (every store call is bounded by it).

        Communicators split from this one are independent: each breaks only when one of its own
        members fails, and is shrunk by its own ``shrink()``.
        """
        secs = self._checker.timeout("shrink", timeout) or self._timeout_s
        deadline = time.monotonic() + secs
        if self._state not in ("active", "broken"):
            self._usable(OpName.shrink)
        # nothing may run on the old engine any more
        with self._lock:
            if self._state == "active":
                self._state = "broken"
                self._broken = CommAbortedError("communicator is being shrunk", comm=self._name, op="shrink")
            pending = list(self._inflight.values())
        for w in pending:
            rec = w.record
            w._finish(WorkStatus.ERROR, CommAbortedError("communicator is being shrunk", comm=self._name,
                                                         op=str(rec.name), seq=rec.seq))
        me = self._global_ranks[self._rank]
        epoch = self._epoch
        while True:
            epoch += 1
            try:
                survivors = agree_on_survivors(
                    self._ctx.store, f"{self._ctx.store_prefix}/shrink{epoch}", me, list(self._global_ranks),
                    self._known_failed, deadline,
                )
            except Exception as e:  # noqa: BLE001 - a store may raise anything
                raise self._agreement_failed(e, secs) from e
            if me not in survivors:
                self._expel("excluded from the survivor set")
                raise CommAbortedError(
                    f"this rank ({me}) is not in the survivor set {survivors} agreed at epoch {epoch}",
                    comm=self._name, op="shrink",
                )
            backend = self._build_engine(survivors, epoch, deadline)
            if backend is not None:
                break
            if time.monotonic() >= deadline:
                raise CommTimeoutError(
                    f"could not rebuild the engine over the survivors within {secs:g} s (a survivor never joined "
                    f"its rendezvous, or {describe_store(self._ctx.store)} did not answer)",
                    timeout_s=secs, comm=self._name, op="shrink")
        return self._become(backend, survivors, epoch)

    def _agreement_failed(self, error: Exception, secs: float) -> CommError:
        """The typed error of a shrink whose agreement failed with ``error``: the store did not
        answer by the deadline (``StoreNotAnswering``), or raised."""
        if isinstance(error, CommError):
            return error
        lost = self._monitor.control_lost if self._monitor is not None else None
        if lost is not None:  # whatever the store raised: without the control plane nothing is agreed
            return CommAbortedError(lost, comm=self._name, op="shrink")
        store = describe_store(self._ctx.store)
        typed = store_error(error, store, secs, dict(comm=self._name, op="shrink"), step=" in the survivor agreement")
        if typed is not None:
            return typed
        if isinstance(error, (TimeoutError, dist.DistStoreError)):
            return CommTimeoutError(f"{store} timed out in the survivor agreement: {error}", timeout_s=secs,
                                    comm=self._name, op="shrink")
        return CommAbortedError(f"{store} failed in the survivor agreement: {error}",
                                comm=self._name, op="shrink")

    # ----------------------------------------------------------------------------------------
    # reconfigure (the reference API's fault-tolerance path, on the same machinery)
    def get_init_handle(self) -> str:
        """This rank's handle for :meth:`reconfigure` (exchange them out of band)."""
        if self._init_handle is None:
            import secrets

            me = self._global_ranks[self._rank]
            run = os.environ.get("TORCHCOMM_RUN_ID") or os.environ.get("TORCHELASTIC_RUN_ID") or "local"
            self._init_handle = f"torchcomms://{run}/{self._name}/{me}/{os.getpid()}/{secrets.token_hex(4)}"
        return self._init_handle

    def reconfigure(self, uuid: Any, init_handles: list[str], timeout: timedelta | None = None,
                    hints: dict[str, str] | None = None) -> TorchWork:
        """Re-form this communicator over the ranks whose handles are listed (new rank = index of
        this rank's handle). Collective over those ranks; ``uuid`` names the configuration and
        must be the same on all of them. Returns a work that completes when the new engine
        context is ready; ops issued before that raise ``CommAbortedError``."""
        c = self._checker
        if not self._options.enable_reconfigure:
            raise c.value_error("reconfigure", "this communicator was not created with enable_reconfigure=True")
        if not isinstance(uuid, (str, int)) or isinstance(uuid, bool) or str(uuid) == "":
            raise c.type_error("reconfigure", f"uuid must be a non-empty str or an int, got {uuid!r}")
        if not isinstance(init_handles, (list, tuple)) or not all(isinstance(h, str) for h in init_handles):
            raise c.type_error("reconfigure", "init_handles must be a list of str (from get_init_handle())")
        if len(set(init_handles)) != len(init_handles):
            raise c.value_error("reconfigure", "init_handles has duplicates")
        mine = self.get_init_handle()
        if mine not in init_handles:
            raise c.value_error("reconfigure", "init_handles does not contain this rank's handle")
        globals_: list[int] = []
        for h in init_handles:
            parts = h.split("/")
            if not h.startswith("torchcomms://") or len(parts) != 7 or not parts[4].isdigit():
                raise c.value_error("reconfigure", f"malformed init handle {h!r}")
            globals_.append(int(parts[4]))
        c.hints("reconfigure", hints)
        secs = c.timeout("reconfigure", timeout) or self._timeout_s
        import hashlib

        key = hashlib.sha1("\n".join(init_handles).encode()).hexdigest()[:12]
        ctx = BackendContext(
            name=self._name, rank=init_handles.index(mine), size=len(init_handles), device=self._device,
            store=self._ctx.store, store_prefix=f"{self._base_prefix}/reconf/{uuid}/{key}",
            timeout=timedelta(seconds=secs), hints={**self._hints, **(hints or {})}, global_ranks=tuple(globals_),
        )
        rec = OpRecord(self._name, tuple(globals_), ctx.rank, ctx.size, self._backend_name, OpName.reconfigure,
                       0, next(_OP_IDS), secs, True, time.time_ns())
        rec.state = "started"
        rec.time_started_ns = rec.time_created_ns
        work = TorchWork(self, rec, time.monotonic() + secs)
        with self._lock:
            if self._state in ("finalized", "expelled", "shrunk"):
                raise CommAbortedError(f"communicator is {self._state}", comm=self._name, op="reconfigure")
            pending = list(self._inflight.values())
            earlier, self._reconf_work = self._reconf_work, work  # only the latest may rebind
            old = self._backend
            self._state = "reconfiguring"
        for w in pending:
            rec_w = w.record
            w._finish(WorkStatus.ERROR, CommAbortedError("communicator is being reconfigured", comm=self._name,
                                                         op=str(rec_w.name), seq=rec_w.seq), state="aborted")
        if earlier is not None:
            earlier._finish(WorkStatus.ERROR, CommAbortedError(
                f"superseded by reconfigure({uuid!r})", comm=self._name, op="reconfigure"), state="aborted")

        def build() -> None:
            try:
                # waited for until the deadline, or until the reconfigure ends otherwise
                # (superseded, aborted): then abandoned, its store calls cancelled
                backend = call_until(
                    "the reconfigured engine's rendezvous", lambda: old.split(ctx), work.deadline,
                    thread_name=f"torchcomms-reconfigure-{self._name}", store=ctx.store,
                    give_up=lambda: work.status is not WorkStatus.INPROGRESS, on_late=lambda b: b.abort())
            except StoreNotAnswering:
                self._expire(work)  # its deadline passed (or it ended already: nothing to do)
                return
            except BaseException as e:  # noqa: BLE001
                work._engine_done(self._build_error(e, rec))
                return
            if not self._rebind(backend, work):
                # The reconfigure ended before its engine was ready (timed out, superseded, the
                # communicator aborted): that engine is never used, and the communicator keeps
                # the state the caller was told about.
                backend.abort()
                work._finish(WorkStatus.ERROR, CommAbortedError(
                    f"communicator became {self._state} before the reconfigured engine was ready",
                    comm=self._name, op="reconfigure"), state="aborted")
                return
            old.abort()
            work._engine_done(None)

        threading.Thread(target=build, name=f"torchcomms-reconfigure-{self._name}", daemon=True).start()
        return work

    def _rebind(self, backend: TorchCommBackend, work: TorchWork) -> bool:
        """Point this communicator at the engine ``work``'s reconfigure built, if that reconfigure
        is still the one in progress (not timed out, superseded or aborted); returns whether it
        did. Checked under the lock that ``_break`` takes: a timeout that lands after the check
        breaks the communicator on the new engine, one before it leaves the new engine unused."""
        ctx = backend.ctx
        with self._lock:
            if (self._reconf_work is not work or work.status is not WorkStatus.INPROGRESS
                    or self._state not in ("reconfiguring", "broken")):
                return False
            self._reconf_work = None
            self._backend = backend
            self._ctx = ctx
            self._rank, self._size = ctx.rank, ctx.size
            self._global_ranks = ctx.global_ranks
            caps = backend.capabilities
            self._checker = Checker(self._name, self._rank, self._size, self._device, caps.dtypes, caps.bitwise_ops)
            self._seq = itertools.count(1)
            self._p2p_seq = itertools.count(1)
            self._last_seq = 0
            self._broken = None
            self._epoch += 1
            self._state = "active"
            old_check, self._signatures = self._signatures, self._new_signature_check()
        if old_check is not None:
            old_check.close(abort=True)
        return True

    def _known_failures(self) -> dict[int, str]:
        """Job ranks (global) known to have failed, each with how it was seen to fail."""
        failed = self._monitor.known_failures() if self._monitor is not None else {}
        failed.update(self._failed_global)
        return failed

    def _known_failed(self) -> set[int]:
        return set(self._known_failures())

    def _build_engine(self, survivors: list[int], epoch: int, deadline: float) -> TorchCommBackend | None:
        """A fresh engine over ``survivors`` under the epoch's store prefix; ``None`` when a
        survivor failed meanwhile (the caller agrees again at the next epoch)."""
        me = self._global_ranks[self._rank]
        ctx = BackendContext(
            name=self._name, rank=survivors.index(me), size=len(survivors), device=self._device,
            store=self._ctx.store, store_prefix=f"{self._ctx.store_prefix}/e{epoch}",
            timeout=timedelta(seconds=max(1.0, deadline - time.monotonic())),
            hints=dict(self._hints), global_ranks=tuple(survivors),
        )
        try:
            return self._build_until(ctx, deadline)
        except BaseException as e:  # noqa: BLE001 - the engine may throw anything
            if self._known_failed() & set(survivors):
                return None
            raise self._build_error(e, OpRecord(
                self._name, self._global_ranks, self._rank, self._size, self._backend_name, OpName.shrink, 0, 0,
                0.0, False, 0)) from None

    def _build_until(self, ctx: BackendContext, deadline: float) -> TorchCommBackend | None:
        """``self._backend.split(ctx)`` on a thread, waited for until ``deadline`` or until one of
        its members (``ctx.global_ranks``) is reported failed: then ``None`` (the build goes on
        until ``ctx.timeout`` ends its rendezvous, which waits on every member and on the store,
        or for as long as a stopped store host does not answer; an engine it still makes is
        aborted, never used). Raises the build's error."""
        members = set(ctx.global_ranks)
        try:
            return call_until(f"the rendezvous of {ctx.name!r}'s engine", lambda: self._backend.split(ctx), deadline,
                              thread_name=f"torchcomms-build-{ctx.name}",
                              give_up=lambda: bool(self._known_failed() & members),
                              on_late=lambda backend: backend.abort(), store=ctx.store)
        except StoreNotAnswering:
            return None  # e.g. its rendezvous waits on a dead or stalled rank, or a stopped store

    def _build_error(self, error: BaseException, rec: OpRecord) -> CommError:
        """The typed error of an engine build (split, shrink, reconfigure, the collective check)
        that raised ``error``: the store's connection failed (its host is gone), or the engine's."""
        if isinstance(error, dist.DistNetworkError):  # raised by a store client, not by an engine's peers
            return store_error(  # type: ignore[return-value]
                error, describe_store(self._ctx.store), rec.timeout_s,
                dict(comm=self._name, op=str(rec.name), seq=rec.seq or None),
                step=" while the new engine rendezvoused",
                control_lost=self._monitor.control_lost if self._monitor is not None else None)
        return self._translate_engine_error(error, rec)

    def _become(self, backend: TorchCommBackend, survivors: list[int], epoch: int) -> TorchComm:
        """Retire this communicator in favour of one over ``survivors``."""
        self._close_engines(abort=True)
        with self._lock:
            self._state = "shrunk"
            self._wake.notify_all()  # its watchdog ends
        NAMES.release(self._name, self)
        new = TorchComm(backend, self._derived_options(self._hints), self._store)
        new._epoch = epoch
        new._failed_global = dict(self._failed_global)
        for table, new_table in ((self._pre_hooks, new._pre_hooks), (self._post_hooks, new._post_hooks),
                                 (self._abort_hooks, new._abort_hooks)):
            new_table.update(table)
        if self._monitor is not None:
            self._monitor.watch(new)
            if new._rank == 0:
                # informative only, so published on a thread of its own: a control plane that
                # stops answering now must not hold the shrink past its deadline
                threading.Thread(target=_publish_quietly, name=f"torchcomms-membership-{self._name}", daemon=True,
                                 args=(self._monitor._client, "membership",
                                       {"comm": self._name, "epoch": epoch, "ranks": survivors})).start()
        self._adopt(new)
        return new

    # ----------------------------------------------------------------------------------------
    # lifecycle
    def finalize(self) -> None:
        """Drain outstanding work and release the engine. Idempotent."""
        if self._state in _RETIRED_STATES:
            self._release()
            return
        if self._state == "active":
            with self._lock:
                pending = list(self._inflight.values())
            for w in pending:
                try:
                    w.wait()
                except CommError:
                    pass
        if self._state == "active":
            self._close_engines(abort=False)
        else:
            self._close_engines(abort=True)
        self._state = "finalized"
        self._release()

    def _release(self) -> None:
        NAMES.release(self._name, self)
        with self._lock:
            self._wake.notify_all()

    def abort(self) -> None:
        """Fail every in-flight and later op with ``CommAbortedError``. Never raises."""
        try:
            revoke = self._options.enable_reconfigure
            with self._lock:
                if self._state in ("aborted", "finalized", "revoked"):
                    return
                self._state = "revoked" if revoke else "aborted"
                pending = list(self._inflight.values())
                if self._reconf_work is not None:  # a reconfigure in progress never binds its engine now
                    pending.append(self._reconf_work)
                    self._reconf_work = None
            for w in pending:
                rec = w.record
                w._finish(
                    WorkStatus.ERROR,
                    CommAbortedError("communicator aborted", comm=self._name, op=str(rec.name), seq=rec.seq),
                    state="aborted",
                )
            self._run_abort_hooks()
            try:
                self._close_engines(abort=True)
            except Exception:  # noqa: BLE001 - abort never raises
                pass
            if not revoke:  # a revoked communicator can still be reconfigured
                self._release()  # (and its watchdog ends)
        except Exception:  # noqa: BLE001
            pass

    def __del__(self) -> None:
        try:
            NAMES.release(self._name, self)
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        return f"TorchComm({self._name!r}, backend={self._backend_name}, rank={self._rank}/{self._size}, {self._state})"

    # ----------------------------------------------------------------------------------------
    # point to point
    def send(self, tensor: torch.Tensor, dst: int, async_op: bool, hints: dict[str, str] | None = None,
             timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        c.tensor("send", "tensor", tensor)
        c.rank_arg("send", "dst", dst, allow_self=False)
        return self._run(OpName.send, async_op, hints, timeout, [tensor], [], self._backend.send,
                         (tensor, dst, 0), peer=dst, is_p2p=True)

    def recv(self, tensor: torch.Tensor, src: int, async_op: bool, hints: dict[str, str] | None = None,
             timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        c.tensor("recv", "tensor", tensor)
        c.rank_arg("recv", "src", src, allow_self=False)
        return self._run(OpName.recv, async_op, hints, timeout, [], [tensor], self._backend.recv,
                         (tensor, src, 0), peer=src, is_p2p=True)

    def batch_op_create(self) -> BatchSendRecv:
        """A new batch of point-to-point ops."""
        return BatchSendRecv(self)

    def _batch_p2p(self, ops: list[P2POp], async_op: bool, hints: dict[str, str] | None,
                   timeout: timedelta | None) -> TorchWork:
        if not ops:
            raise self._checker.value_error("batch_p2p", "the batch is empty; add send()/recv() ops before issue()")
        sends = [o.tensor for o in ops if o.type is P2POpType.SEND]
        recvs = [o.tensor for o in ops if o.type is P2POpType.RECV]
        triples = [(o.type is P2POpType.SEND, o.tensor, o.peer) for o in ops]
        return self._run(OpName.batch_p2p, async_op, hints, timeout, sends, recvs, self._backend.batch_p2p,
                         (triples, 0), is_p2p=True)

    # ----------------------------------------------------------------------------------------
    # collectives
    def broadcast(self, tensor: torch.Tensor, root: int, async_op: bool, hints: dict[str, str] | None = None,
                  timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        c.tensor("broadcast", "tensor", tensor)
        c.rank_arg("broadcast", "root", root)
        return self._run(OpName.broadcast, async_op, hints, timeout, [tensor], [tensor], self._backend.broadcast,
                         (tensor, root), root=root)

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, async_op: bool, hints: dict[str, str] | None = None,
                   timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        c.tensor("all_reduce", "tensor", tensor)
        c.reduce_op("all_reduce", op, tensor.dtype)
        return self._run(OpName.all_reduce, async_op, hints, timeout, [tensor], [tensor], self._backend.all_reduce,
                         (tensor, op), reduce_op=op)

    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp, async_op: bool,
               hints: dict[str, str] | None = None, timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        c.tensor("reduce", "tensor", tensor)
        c.rank_arg("reduce", "root", root)
        c.reduce_op("reduce", op, tensor.dtype)
        return self._run(OpName.reduce, async_op, hints, timeout, [tensor], [tensor], self._backend.reduce,
                         (tensor, root, op), root=root, reduce_op=op)

    def all_gather(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor, async_op: bool,
                   hints: dict[str, str] | None = None, timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        c.tensor("all_gather", "tensor", tensor)
        c.list_like("all_gather", "tensor_list", tensor_list, "tensor", tensor)
        return self._run(OpName.all_gather, async_op, hints, timeout, [tensor], list(tensor_list),
                         self._backend.all_gather, (list(tensor_list), tensor))

    def all_gather_v(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor, async_op: bool,
                     hints: dict[str, str] | None = None, timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        c.tensor("all_gather_v", "tensor", tensor)
        c.tensor_list("all_gather_v", "tensor_list", tensor_list, self._size)
        for i, t in enumerate(tensor_list):
            c.same_dtype("all_gather_v", f"tensor_list[{i}]", t, "tensor", tensor)
        c.same_shape("all_gather_v", f"tensor_list[{self._rank}]", tensor_list[self._rank], "tensor", tensor)
        return self._run(OpName.all_gather_v, async_op, hints, timeout, [tensor], list(tensor_list),
                         self._backend.all_gather_v, (list(tensor_list), tensor))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, async_op: bool,
                          hints: dict[str, str] | None = None, timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        c.tensor("all_gather_single", "input", input)
        c.tensor("all_gather_single", "output", output)
        c.same_dtype("all_gather_single", "output", output, "input", input)
        c.numel_ratio("all_gather_single", "output", output, "input", input)
        return self._run(OpName.all_gather_single, async_op, hints, timeout, [input], [output],
                         self._backend.all_gather_single, (output, input))

    def reduce_scatter(self, output: torch.Tensor, input_list: list[torch.Tensor], op: ReduceOp, async_op: bool,
                       hints: dict[str, str] | None = None, timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        c.tensor("reduce_scatter", "output", output)
        c.list_like("reduce_scatter", "input_list", input_list, "output", output)
        c.reduce_op("reduce_scatter", op, output.dtype)
        return self._run(OpName.reduce_scatter, async_op, hints, timeout, list(input_list), [output],
                         self._backend.reduce_scatter, (output, list(input_list), op), reduce_op=op)

    def reduce_scatter_v(self, output: torch.Tensor, input_list: list[torch.Tensor], op: ReduceOp, async_op: bool,
                         hints: dict[str, str] | None = None, timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        c.tensor("reduce_scatter_v", "output", output)
        c.tensor_list("reduce_scatter_v", "input_list", input_list, self._size)
        for i, t in enumerate(input_list):
            c.same_dtype("reduce_scatter_v", f"input_list[{i}]", t, "output", output)
        c.same_shape("reduce_scatter_v", f"input_list[{self._rank}]", input_list[self._rank], "output", output)
        c.reduce_op("reduce_scatter_v", op, output.dtype)
        return self._run(OpName.reduce_scatter_v, async_op, hints, timeout, list(input_list), [output],
                         self._backend.reduce_scatter_v, (output, list(input_list), op), reduce_op=op)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, op: ReduceOp, async_op: bool,
                              hints: dict[str, str] | None = None, timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        c.tensor("reduce_scatter_single", "input", input)
        c.tensor("reduce_scatter_single", "output", output)
        c.same_dtype("reduce_scatter_single", "output", output, "input", input)
        c.numel_ratio("reduce_scatter_single", "input", input, "output", output)
        c.reduce_op("reduce_scatter_single", op, output.dtype)
        return self._run(OpName.reduce_scatter_single, async_op, hints, timeout, [input], [output],
                         self._backend.reduce_scatter_single, (output, input, op), reduce_op=op)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, async_op: bool,
                          hints: dict[str, str] | None = None, timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        op = "all_to_all_single"
        c.tensor(op, "input", input)
        c.tensor(op, "output", output)
        c.same_dtype(op, "output", output, "input", input)
        if output.numel() != input.numel():
            raise c.value_error(op, f"output has {output.numel()} elements but input has {input.numel()}")
        if input.numel() % self._size:
            raise c.value_error(op, f"input's {input.numel()} elements do not split evenly over {self._size} ranks")
        return self._run(OpName.all_to_all_single, async_op, hints, timeout, [input], [output],
                         self._backend.all_to_all_single, (output, input))

    def all_to_all_v_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                            input_split_sizes: list[int], async_op: bool, hints: dict[str, str] | None = None,
                            timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        op = "all_to_all_v_single"
        c.tensor(op, "input", input)
        c.tensor(op, "output", output)
        c.same_dtype(op, "output", output, "input", input)
        if input.dim() == 0 or output.dim() == 0:
            raise c.value_error(op, "input and output must have at least one dimension to split along")
        if input.shape[1:] != output.shape[1:]:
            raise c.value_error(op, f"input and output must agree beyond dim 0: {tuple(input.shape)} vs {tuple(output.shape)}")
        outs = c.split_sizes(op, "output_split_sizes", output_split_sizes, output)
        ins = c.split_sizes(op, "input_split_sizes", input_split_sizes, input)
        return self._run(OpName.all_to_all_v_single, async_op, hints, timeout, [input], [output],
                         self._backend.all_to_all_v_single, (output, input, outs, ins))

    def all_to_all(self, output_tensor_list: list[torch.Tensor], input_tensor_list: list[torch.Tensor],
                   async_op: bool, hints: dict[str, str] | None = None, timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        op = "all_to_all"
        c.tensor_list(op, "output_tensor_list", output_tensor_list, self._size)
        c.tensor_list(op, "input_tensor_list", input_tensor_list, self._size)
        dt = input_tensor_list[0].dtype if input_tensor_list else None
        for i, t in enumerate(list(input_tensor_list) + list(output_tensor_list)):
            if t.dtype != dt:
                raise c.type_error(op, f"all tensors must share one dtype; found {dt} and {t.dtype}")
        return self._run(OpName.all_to_all, async_op, hints, timeout, list(input_tensor_list),
                         list(output_tensor_list), self._backend.all_to_all,
                         (list(output_tensor_list), list(input_tensor_list)))

    def barrier(self, async_op: bool, hints: dict[str, str] | None = None,
                timeout: timedelta | None = None) -> TorchWork:
        return self._run(OpName.barrier, async_op, hints, timeout, [], [], self._backend.barrier, ())

    def scatter(self, output_tensor: torch.Tensor, input_tensor_list: list[torch.Tensor], root: int,
                async_op: bool, hints: dict[str, str] | None = None, timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        op = "scatter"
        c.tensor(op, "output_tensor", output_tensor)
        c.rank_arg(op, "root", root)
        inputs: list[torch.Tensor] = []
        if self._rank == root:
            c.list_like(op, "input_tensor_list", input_tensor_list, "output_tensor", output_tensor)
            inputs = list(input_tensor_list)
        return self._run(OpName.scatter, async_op, hints, timeout, inputs, [output_tensor], self._backend.scatter,
                         (output_tensor, inputs if self._rank == root else None, root), root=root)

    def gather(self, output_tensor_list: list[torch.Tensor], input_tensor: torch.Tensor, root: int, async_op: bool,
               hints: dict[str, str] | None = None, timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        op = "gather"
        c.tensor(op, "input_tensor", input_tensor)
        c.rank_arg(op, "root", root)
        outputs: list[torch.Tensor] = []
        if self._rank == root:
            c.list_like(op, "output_tensor_list", output_tensor_list, "input_tensor", input_tensor)
            outputs = list(output_tensor_list)
        return self._run(OpName.gather, async_op, hints, timeout, [input_tensor], outputs, self._backend.gather,
                         (outputs if self._rank == root else None, input_tensor, root), root=root)

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, root: int, async_op: bool,
                      hints: dict[str, str] | None = None, timeout: timedelta | None = None) -> TorchWork:
        c = self._checker
        op = "gather_single"
        c.tensor(op, "input", input)
        c.rank_arg(op, "root", root)
        outputs: list[torch.Tensor] = []
        if self._rank == root:
            c.tensor(op, "output", output)
            c.same_dtype(op, "output", output, "input", input)
            c.numel_ratio(op, "output", output, "input", input)
            outputs = [output]
        return self._run(OpName.gather_single, async_op, hints, timeout, [input], outputs,
                         self._backend.gather_single, (output if self._rank == root else None, input, root), root=root)

    # ----------------------------------------------------------------------------------------
    # management
    def split(self, ranks: list[int], name: str, hints: dict[str, str] | None = None,
              timeout: timedelta | None = None) -> TorchComm | None:
        """Collective over every rank of this communicator. Members pass the same ``ranks``
        (new rank = index in it) and get the new communicator; non-members pass ``[]`` and get
        ``None``."""
        c = self._checker
        members = c.split_ranks(ranks)
        if not isinstance(name, str) or not name:
            raise c.value_error("split", f"name must be a non-empty str, got {name!r}")
        c.hints("split", hints)
        width = self._size + 1
        mine = torch.full((width,), -1, dtype=torch.int64, device=self._device)
        mine[0] = len(members)
        if members:
            mine[1 : 1 + len(members)] = torch.tensor(members, dtype=torch.int64)
        table = torch.empty(self._size * width, dtype=torch.int64, device=self._device)
        work = self._run(OpName.split, False, hints, timeout, [mine], [table], self._backend.all_gather_single,
                         (table, mine))
        seq = work.record.seq
        rows = table.view(self._size, width).cpu().tolist()
        for r in members:
            row = rows[r]
            theirs = row[1 : 1 + row[0]]
            if theirs != members:
                raise CollectiveMismatchError(
                    f"split: rank {self._rank} passed ranks {members} but member rank {r} passed {theirs}",
                    comm=self._name, op="split", seq=seq, ranks=[self._rank, r],
                )
        if not members:
            return None
        incarnation = NAMES.claim(name)
        try:
            child_ctx = BackendContext(
                name=name,
                rank=members.index(self._rank),
                size=len(members),
                device=self._device,
                store=self._ctx.store,
                store_prefix=f"{self._ctx.store_prefix}/split{seq}/{name}/{incarnation}/{_ranks_key(members)}",
                timeout=timedelta(seconds=self._timeout_s),
                hints={**self._hints, **(hints or {})},
                global_ranks=tuple(self._global_ranks[r] for r in members),
            )
            # The new engine's rendezvous waits on every member: bounded by this split's own
            # deadline (which its exchange above already counted down), not by the engine's.
            try:
                child_backend = self._build_until(child_ctx, work.deadline)
            except BaseException as e:  # noqa: BLE001 - the engine may throw anything
                raise self._build_error(e, work.record) from None
            if child_backend is None:
                raise self._engine_not_built(work.record, child_ctx.global_ranks, "the new communicator's engine")
            opts = self._derived_options(child_ctx.hints)
            child = TorchComm(child_backend, opts, self._store)
        except BaseException:
            NAMES.release(name, None)  # type: ignore[arg-type]
            raise
        self._adopt(child)
        return child

    def _engine_not_built(self, rec: OpRecord, members: tuple[int, ...], what: str) -> CommError:
        """Why the engine ``what`` (``split``'s new one, the collective check's) was abandoned: a
        member failed, or the op's deadline passed."""
        how = self._known_failures()
        failed = how.keys() & set(members)
        ctx = dict(comm=self._name, op=str(rec.name), seq=rec.seq)
        if failed:
            return PeerFailureError(
                f"a member failed while {what} was built",
                failed_ranks=[self._global_ranks.index(g) for g in sorted(failed) if g in self._global_ranks],
                detected_by=",".join(sorted({how[g] for g in failed})), **ctx)  # type: ignore[arg-type]
        return CommTimeoutError(
            f"{what} was not ready within {rec.timeout_s:g} s "
            f"(a member never joined its rendezvous, or {describe_store(self._ctx.store)} did not answer)",
            timeout_s=rec.timeout_s, **ctx)  # type: ignore[arg-type]

    def _derived_options(self, hints: dict[str, str]) -> CommOptions:
        """This communicator's options, with its current timeout, for one derived from it."""
        return dataclasses.replace(self._options, timeout=timedelta(seconds=self._timeout_s), hints=dict(hints))

    def _adopt(self, child: TorchComm) -> None:
        """Hand this communicator's observers to a communicator derived from it."""
        self._children.append(weakref.ref(child))
        if self._monitor is not None and child._monitor is None:
            self._monitor.watch(child)
        for obs in list(self._observers):
            child.add_observer(obs)
            on_new = getattr(obs, "on_new_comm", None)
            if on_new is not None:
                on_new(child)
