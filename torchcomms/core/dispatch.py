"""The one dispatch path of every operation: validate -> record -> hooks -> backend -> work.

``TorchComm``'s ops check their own arguments (step 1, ``core.validation``) and call
:func:`dispatch`, which does the rest: the op's sequence number and record, the pre-hooks,
the collective check where it is on, the engine call, and the ``TorchWork`` that owns the
op's completion, deadline and error (post-hooks run from it).
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import torch

from torchcomms.backends.base import ENGINE_WAIT_SLICE_S, EngineHandle
from torchcomms.core import error_map
from torchcomms.core.comm_core import CommCore
from torchcomms.core.errors import CollectiveMismatchError, CommError, CommTimeoutError
from torchcomms.core.op import OpRecord
from torchcomms.core.state import CommState
from torchcomms.core.store_calls import EngineNotReady
from torchcomms.core.types import OpName, ReduceOp, WorkStatus
from torchcomms.core.work import TorchWork

#: Process-wide op ids (a record's ``op_id``: unique across communicators).
OP_IDS = itertools.count(1)
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
        dt = tensors[0].dtype
        return [_DTYPE_NAMES.get(dt) or _dtype_name(dt)]
    return [_dtype_name(t.dtype) for t in tensors]


def dispatch(
    core: CommCore,
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
    bind: Callable[[OpRecord], None] | None = None,
) -> TorchWork:
    """Run op ``name`` (its arguments already checked): ``launch(*args)`` is the backend call;
    ``bind(record)``, when given, is called with the op's record before any hook or the engine
    sees it (an engine that fills in the record later, like a receive from any source)."""
    checker = core.checker
    if async_op is not True and async_op is not False:
        raise checker.type_error(str(name), f"async_op must be a bool, got {type(async_op).__name__}")
    timeout_s = checker.timeout(str(name), timeout) if timeout is not None else core.timeout_s
    if hints is not None:
        checker.hints(str(name), hints)
    if core.life.state is not CommState.ACTIVE:
        raise core.refusal(name)
    # In the collective check, threads that share the communicator take their sequence numbers,
    # pass the check and reach the engine one at a time: each rank's signatures then meet on the
    # check's engine, and its ops on the engine, in sequence order (else two threads' calls,
    # alike on every rank, met out of order and were called a mismatch).
    order = core.signatures.order if core.signatures is not None and not is_p2p else None
    if order is not None:
        order.acquire()
    try:
        if is_p2p:
            seq = next(core.p2p_seq)
        else:
            seq = next(core.seq)
            core.last_seq = seq
        op_id = next(OP_IDS)
        in_sizes, in_dtypes = _shapes(inputs), _dtype_names(inputs)  # once when outputs is inputs (in place)
        rec = OpRecord(
            core.name, core.global_ranks, core.rank, core.size, core.backend_name, name, seq, op_id,
            timeout_s, async_op, time.time_ns(), is_p2p=is_p2p, peer=None if peer is None else int(peer),
            root=None if root is None else int(root),
            reduce_op=reduce_op.label if reduce_op is not None else None,
            input_sizes=in_sizes, input_dtypes=in_dtypes,
            output_sizes=in_sizes if outputs is inputs else _shapes(outputs),
            output_dtypes=in_dtypes if outputs is inputs else _dtype_names(outputs),
            hints=hints,
        )
        if bind is not None:
            bind(rec)
        # an op on memory that an earlier asynchronous op still uses runs after it (busy_memory)
        blocked = (core.busy.wait_for_conflicts(rec, inputs, outputs, time.monotonic() + timeout_s)
                   if core.busy_ops else None)
        if core.pre_hooks:
            rec.extra = {"inputs": inputs, "outputs": outputs}  # for hooks that inspect data
            try:
                for hook in tuple(core.pre_hooks.values()):
                    hook(name, op_id, rec)
            finally:
                rec.extra = None  # tracing keeps records: never pin the tensors
        work = TorchWork(core, rec, time.monotonic() + timeout_s)
        if async_op and core.busy is not None:
            core.busy.claim(work, inputs, outputs, is_p2p)
        rec.state = "started"
        rec.time_started_ns = time.time_ns()
        mismatch = _compare_signatures(core, rec, work) if order is not None and blocked is None else blocked
        try:
            if mismatch is not None:
                handle = EngineHandle.failed(mismatch)
            elif core.life.state is not CommState.ACTIVE:  # broken while the hooks or the check ran
                handle = EngineHandle.failed(_late_break_error(core, rec))
            else:
                rec.in_engine = True
                handle = launch(*args, async_op=async_op) if core.current_stream_sync else launch(*args)
        except Exception as e:  # noqa: BLE001 - the engine may throw anything
            handle = EngineHandle.failed(e)
    finally:
        if order is not None:
            order.release()
    if handle.is_immediate:
        rec.in_engine = False
    if handle.stream_ordered:
        work.stream_op = handle
    if not handle.is_immediate:
        if not async_op and handle.can_wait_in_engine:
            _wait_in_engine(core, work, handle)
            return work
        _track(core, work)
        handle.on_done(work.engine_done)
    elif handle.succeeded_in_call:
        work.finish(WorkStatus.COMPLETED, None)  # ended inside the call: skip the callback chain
    else:
        handle.on_done(work.engine_done)
    if not async_op and (work.exception() is not None or not work.done):
        work.wait()
    return work


def _track(core: CommCore, work: TorchWork) -> None:
    """Enter ``work`` into the watchdog's table (its deadline, and the ops a break or an abort
    fails)."""
    core.watchdog.track(work)
    if work.status is not WorkStatus.INPROGRESS:
        # ended while it was not in the table yet (a break or abort that found it among the
        # synchronous ops of their first slice): its end did not take it out, so this does
        core.watchdog.forget(work)
    elif core.life.state is not CommState.ACTIVE:
        # A break that landed between the state check and ``track`` did not see this op
        # (``mark_broken`` fails the ops ``in_flight_locked`` lists): fail it now, or it would
        # wait on the engine for a dead peer until its deadline. After ``track`` any later break sees it.
        work.finish(WorkStatus.ERROR, _late_break_error(core, work.record))


def _late_break_error(core: CommCore, rec: OpRecord) -> CommError:
    """The error of an op whose communicator broke after its state check passed: the one an op
    in flight gets from that break (``PeerFailureError`` for a peer failure)."""
    cause = core.broken
    if cause is None:
        return core.refusal(rec.name)
    return error_map.in_flight_error(cause, core.where(rec))


def _compare_signatures(core: CommCore, rec: OpRecord, work: TorchWork) -> CommError | None:
    """The collective check (debug mode): ``None`` when every rank is making this same call,
    else the error the op ends with on every rank (see ``recovery.collective_check``)."""
    assert core.signatures is not None
    where = core.where(rec)
    try:
        verdict = core.signatures.run(rec, work.deadline)
    except EngineNotReady:
        return error_map.engine_not_built("the collective check's engine", core.global_ranks,
                                          core.known_failures(), core.global_ranks, core.ctx.store,
                                          rec.timeout_s, where)
    except TimeoutError:
        return CommTimeoutError(
            f"did not complete within {rec.timeout_s:g} s (not every rank reached this collective)",
            timeout_s=rec.timeout_s, **where)
    except BaseException as e:  # noqa: BLE001 - the engine may throw anything
        kind = "" if isinstance(e, CommError) else core.backend.classify_error(e)
        return error_map.build_error(e, core.ctx.store, rec.timeout_s, where, kind, core.global_ranks, core.monitor)
    if verdict is None:
        return None
    message, ranks = verdict
    return CollectiveMismatchError(message, ranks=ranks, **where)


def _wait_in_engine(core: CommCore, work: TorchWork, handle: EngineHandle) -> None:
    """The synchronous fast path: block in the engine on the caller's thread, as c10d does,
    instead of a future callback on the engine's thread waking this one. The wait runs in
    slices so that an op ended elsewhere (deadline, peer failure, abort) is seen within one
    slice; raises the op's error like ``wait()``. An op ended elsewhere while the engine still
    runs it is left to the engine, which clears ``record.in_engine`` when it is done with it.

    The op enters the watchdog's table only if it outlasts the first slice: the caller's own
    loop enforces the deadline, and breaks, aborts and ``finalize`` find it in
    ``core.engine_waits`` meanwhile (``CommCore.in_flight_locked``). Most ops end within the
    first slice and so skip the table's lock and heap on both ends, which matters most right
    after a large op's data has evicted the interpreter from the caches, where each such step
    costs microseconds (``benchmarks/diagnostics/mpi_cold_dispatch.py``)."""
    waits = core.engine_waits
    waits.add(work)  # until the wait ends: breaks, aborts and finalize() see it (in_flight_locked)
    in_table = returned = False
    while work.status is WorkStatus.INPROGRESS:
        remaining = work.deadline - time.monotonic()
        if remaining <= 0:
            core.expire(work)
            break
        done, error = handle.wait_engine(min(ENGINE_WAIT_SLICE_S, remaining))
        if done:
            returned = True
            work.engine_done(error)
            break
        if not in_table:  # it outlasted its first slice
            _track(core, work)
            in_table = True
    waits.discard(work)
    if not returned:
        rec = work.record
        handle.on_engine_end(lambda: setattr(rec, "in_engine", False))
    if not work.done:  # ended elsewhere, whose post-hooks may still run: wait() bounds that
        work.wait()
    exc = work.exception()
    if exc is not None:
        raise exc
