"""The CUDA engine: c10d's ProcessGroupNCCL used as a library.

Why c10d's engine rather than NCCL through ctypes: it is abortable (``ncclCommAbort``), it
already carries NCCL's split (``Options.split_from`` -> ``ncclCommSplit``) and shrink
(``Backend.shrink`` -> ``ncclCommShrink``, NCCL >= 2.27) on torch 2.11 and 2.13, it handles
the allocator safety of tensors used on its internal stream, the uneven all-gather /
reduce-scatter, PREMUL_SUM and AVG, and it needs no compiled code of ours. Its
``init_process_group`` global state is never touched.

Streams: a synchronous op runs on the caller's current stream (c10d's ``asyncOp=False``: no
cross-stream events, no stashed tensors), as ``torch.distributed``'s own synchronous calls do;
an asynchronous op runs on the engine's internal NCCL stream, which first waits on the
caller's current stream. Completion is reported by a lazy poller (``nccl_completion``), never
by blocking the host; ``TorchWork.wait()`` makes the current stream wait on the op's end event
(a synchronous op is waited for so at once, as c10d does).

Timing: where the communicator is traced (the default tracing with its flight recorder, or the
hint ``nccl.timing=1``), c10d records a start event beside each op's end event
(``TORCH_NCCL_ENABLE_TIMING``, read when the engine is made: the Python binding of
``enableCollectivesTiming`` sits on the ``ProcessGroup`` wrapper, which is not used here; a
synchronous op for which c10d returns no work is timed by events of ours) and the op's device
time is read from the two when the poller sees it completed (``Work._get_duration``: no host
synchronization), into the op record's ``device_duration_ms``; the flight recorder dumps it as
the entry's ``duration_ms``.

c10d's own failure handling is switched off so that it can never end the process behind the
communicator's back (this project raises typed errors instead of the reference's SIGABRT):
``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` (no tear-down on an error or timeout),
``TORCH_NCCL_ENABLE_MONITORING=0`` (no heartbeat monitor that aborts a stuck watchdog),
``TORCH_NCCL_DUMP_ON_TIMEOUT=0``, ``TORCH_NCCL_BLOCKING_WAIT=0``, and the engine's own op
timeout is a one-day backstop: ``TorchComm`` ends each op at that op's deadline.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from torchcomms.backends import exit_release
from torchcomms.backends.base import (HIGH_PRIORITY_STREAM_HINT, BackendCapabilities, BackendContext, EngineHandle,
                                      TorchCommBackend, premul_in_place, premul_scaled)
from torchcomms.backends.nccl_completion import CompletionPoller, CurrentStreamWork, EngineFailed, StreamOrderedHandle
from torchcomms.config import settings
from torchcomms.types import RedOpType, ReduceOp

#: c10d settings that would let its watchdog abort the process or block the host on its own
C10D_NCCL_ENV = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
    "TORCH_NCCL_ENABLE_MONITORING": "0",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    "TORCH_NCCL_BLOCKING_WAIT": "0",
}
#: the engine's own limit on an op; ``TorchComm`` ends each op at the op's own deadline
ENGINE_OP_BACKSTOP = timedelta(days=1)
#: how long the interpreter's exit waits for an unfinalized engine's pending ops (seconds)
EXIT_DRAIN_S = 2.0
#: how long ``finalize()`` waits for the completion poller's thread to leave its loop (seconds)
POLLER_JOIN_S = 2.0
#: how long ``abort()`` waits for ``ncclCommAbort`` before abandoning the engine to a thread
ABORT_WAIT_S = 5.0
#: how long ``finalize()`` waits for the GPU to finish work already issued
FINALIZE_DRAIN_S = 60.0
#: ``ncclCommShrink``'s flag that aborts the parent's pending operations first
NCCL_SHRINK_ABORT = 1

_C10D_OPS = {
    RedOpType.SUM: dist.ReduceOp.SUM,
    RedOpType.AVG: dist.ReduceOp.AVG,
    RedOpType.PRODUCT: dist.ReduceOp.PRODUCT,
    RedOpType.MIN: dist.ReduceOp.MIN,
    RedOpType.MAX: dist.ReduceOp.MAX,
}
_NCCL_DTYPES = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
     torch.float64}
)
#: c10d options carry ``asyncOp`` (False: the op runs on the current stream) on torch >= 2.8
_HAS_ASYNC_OP = dist.is_available() and hasattr(dist.AllreduceOptions(), "asyncOp")
#: hint that turns the engine's per-op event timing on ("1") or off ("0"); default: on where
#: the communicator gets the default tracing (flight recorder)
TIMING_HINT = "nccl.timing"
_PEER_PATTERNS = ("remote process exited", "network error", "ncclremoteerror", "ncclsystemerror",
                  "connection closed", "connection reset")
_TIMEOUT_PATTERNS = ("timed out", "timeout")
#: c10d's switch for per-op start events, read when a ProcessGroupNCCL is constructed
TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"
_TIMING_ENV_LOCK = threading.Lock()
# Engines whose abort did not return in time: kept referenced so that their destructors (which
# wait on a stuck NCCL call) never run on a user's thread.
_ABANDONED: list[object] = []


def _c10d_env() -> None:
    for key, value in C10D_NCCL_ENV.items():
        os.environ[key] = value


@contextmanager
def _c10d_timing(on: bool, exclusive: bool = True) -> Iterator[None]:
    """c10d's per-op start events on (or off) for the engines made inside: ProcessGroupNCCL
    reads ``TORCH_NCCL_ENABLE_TIMING`` in its constructor. The variable is restored after, so
    the caller's own process groups keep the caller's setting. ``exclusive=False`` for a body
    that waits on peers (a shrink): a lock held there could order two threads' collectives
    differently in two processes."""
    lock = _TIMING_ENV_LOCK if exclusive else nullcontext()
    with lock:
        before = os.environ.get(TIMING_ENV)
        os.environ[TIMING_ENV] = "1" if on else "0"
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(TIMING_ENV, None)
            else:
                os.environ[TIMING_ENV] = before


def _reduce_op(op: ReduceOp) -> Any:
    """c10d's reduce op for ``op``. PREMUL_SUM is a SUM whose caller scaled the input first
    (``premul_in_place`` / ``premul_scaled``, on the current stream, which the op waits on):
    c10d's native PREMUL_SUM (``_make_nccl_premul_sum``) gave wrong results on the H200 (torch
    2.11, NCCL 2.28.9, one rank): zeros from a bfloat16 all-reduce, an unscaled float32
    reduce-scatter."""
    if op.type is RedOpType.PREMUL_SUM:
        return dist.ReduceOp.SUM
    return _C10D_OPS[op.type]


def _options(kind: Any, async_op: bool, **fields: Any) -> Any:
    """A c10d options object; ``asyncOp`` set where this torch has it."""
    opts = kind()
    for key, value in fields.items():
        setattr(opts, key, value)
    if _HAS_ASYNC_OP:
        opts.asyncOp = async_op
    return opts


def _timing_wanted(hints: dict[str, str]) -> bool:
    value = hints.get(TIMING_HINT, "")
    if value in ("0", "1"):
        return value == "1"
    s = settings()
    return not s.tracing_disable and s.fr_max_entries > 0


def _supports(pg: Any, flag: str) -> bool:
    """c10d's ``supports_splitting``/``supports_shrinking``: a property or a method by version."""
    value = getattr(pg, flag, False)
    return bool(value() if callable(value) else value)


class NcclBackend(TorchCommBackend):
    """Collectives on CUDA tensors through ``ProcessGroupNCCL``; see the module docstring."""

    backend_name = "nccl"
    capabilities = BackendCapabilities(devices=("cuda",), abort=True, shrink=True, split=True, dtypes=_NCCL_DTYPES,
                                       bitwise_ops=False, current_stream_sync=True,
                                       orders_ops_on_shared_memory=True)

    @classmethod
    def is_available(cls) -> bool:
        return torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available()

    # --- lifecycle -----------------------------------------------------------------------------
    def init(self, split_from: NcclBackend | None = None, exclude: list[int] | None = None) -> None:
        """Create the engine and its NCCL communicator now (not at the first op, which would
        then block the host in NCCL's rendezvous): fresh through the store's unique-id
        exchange, or from ``split_from``'s communicator by ``ncclCommSplit``."""
        ctx = self.ctx
        if ctx.device.type != "cuda" or ctx.device.index is None:
            raise ValueError(f"the nccl backend needs a cuda device with an index, got {ctx.device}")
        _c10d_env()
        self._device = ctx.device
        self._pg: Any = None
        self._aborted = False
        self._barrier_buf: torch.Tensor | None = None
        self._timed = _timing_wanted(ctx.hints)
        # whether c10d returned a work for a synchronous op (then with its own start event):
        # until it does, timed synchronous ops record a start event of ours (see _issue)
        self._sync_work_given = False
        if exclude is not None and split_from is not None:
            with _c10d_timing(self._timed, exclusive=False):
                self._pg = split_from._pg.shrink(exclude, NCCL_SHRINK_ABORT)
        else:
            store = ctx.store if ctx.store is not None else dist.HashStore()
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = ctx.timeout  # bounds the rendezvous; ops get the backstop below
            opts.is_high_priority_stream = ctx.hints.get(HIGH_PRIORITY_STREAM_HINT, "") in ("1", "true")
            opts.global_ranks_in_group = list(ctx.global_ranks or range(ctx.size))
            if split_from is not None:
                opts.split_from = split_from._pg
                opts.split_color = _split_color(ctx.global_ranks)
            with torch.cuda.device(self._device):
                with _c10d_timing(self._timed):  # not held over the rendezvous below
                    self._pg = dist.ProcessGroupNCCL(dist.PrefixStore(ctx.store_prefix + "/nccl", store), ctx.rank,
                                                     ctx.size, opts)
                self._pg.eager_connect_single_device(self._device)
        set_timeout = getattr(self._pg, "_set_default_timeout", None)  # absent on a shrunk c10d Backend
        if set_timeout is not None:
            set_timeout(ENGINE_OP_BACKSTOP)
        self._opts: dict[tuple[Any, ...], Any] = {}  # c10d options by (op, reduction/root, async_op)
        self._poller = CompletionPoller(ctx.name, self._engine_error)
        exit_release.watch(self)

    def version(self) -> str:
        v = torch.cuda.nccl.version()
        return f"nccl {'.'.join(map(str, v)) if isinstance(v, tuple) else v} (torch {torch.__version__})"

    def engine(self) -> Any:
        return self._pg

    def split(self, ctx: BackendContext) -> NcclBackend:
        """Split through NCCL: ``ncclCommShrink`` when ``ctx`` is this communicator's survivors
        (same name, fewer ranks: a shrink), else ``ncclCommSplit`` (every rank of this
        communicator takes part: non-members through :meth:`split_excluded`). Falls back to a
        fresh communicator under ``ctx``'s store prefix where the engine cannot split."""
        child = type(self)(ctx)
        mine = tuple(self.ctx.global_ranks or range(self.ctx.size))
        theirs = tuple(ctx.global_ranks or range(ctx.size))
        pg = getattr(self, "_pg", None)
        if pg is None or self._aborted:
            child.init()
        elif ctx.name == self.ctx.name and len(theirs) < len(mine) and set(theirs) <= set(mine) \
                and _supports(pg, "supports_shrinking"):
            try:
                child.init(split_from=self, exclude=[i for i, g in enumerate(mine) if g not in theirs])
            except RuntimeError:  # ncclCommShrink refused (the parent's state): a fresh communicator
                child.init()
        elif set(theirs) <= set(mine) and _supports(pg, "supports_splitting") and ctx.name != self.ctx.name:
            child.init(split_from=self)
        else:
            child.init()
        return child

    def split_excluded(self) -> None:
        """This rank is not in a split: take part in the parent's ``ncclCommSplit`` anyway."""
        pg = getattr(self, "_pg", None)
        if pg is not None and not self._aborted and _supports(pg, "supports_splitting"):
            pg.perform_nocolor_split(self._device)

    def finalize(self) -> None:
        """Wait for the GPU to finish what was issued, then destroy the NCCL communicator."""
        pg = getattr(self, "_pg", None)
        if pg is None:
            return
        self._poller.drain(time.monotonic() + FINALIZE_DRAIN_S)
        self._poller.stop(join_s=POLLER_JOIN_S)  # not inside an engine call when the engine goes
        try:
            pg.shutdown()
        except Exception:  # noqa: BLE001 - already destroyed or aborted
            pass
        self._pg = None

    def release_at_exit(self) -> None:
        """Finalize, at the interpreter's exit (``exit_release``), an engine no communicator
        finalized, unless an op of it is still pending on the GPU after ``EXIT_DRAIN_S`` (its
        destruction would wait for it). Left to finalization, c10d's watchdog thread letting go
        of ops on tensors the program dropped aborted the process ("terminate called without an
        active exception", the H200, torch 2.11), as gloo's workers did."""
        if getattr(self, "_pg", None) is None or self._aborted:
            return
        if self._poller.drain(time.monotonic() + EXIT_DRAIN_S):
            self.finalize()

    def abort(self) -> None:
        """``ncclCommAbort``: NCCL kernels still running stop, the communicator is destroyed.
        Never blocks more than ``ABORT_WAIT_S``: an abort that waits on a stuck NCCL call (an
        initialization whose peer never came) is left to finish on a daemon thread."""
        pg = getattr(self, "_pg", None)
        self._aborted = True
        poller = getattr(self, "_poller", None)
        if poller is not None:
            poller.stop()
        if pg is None:
            return
        self._pg = None
        _ABANDONED.append(pg)
        done = threading.Event()

        def run() -> None:
            try:
                pg.abort()
            except Exception:  # noqa: BLE001 - abort never raises
                pass
            done.set()

        threading.Thread(target=run, name=f"torchcomms-nccl-abort-{self.ctx.name}", daemon=True).start()
        if done.wait(ABORT_WAIT_S):
            _ABANDONED.remove(pg)

    def classify_error(self, error: BaseException) -> str:
        msg = str(error).lower()
        if any(p in msg for p in _TIMEOUT_PATTERNS):
            return "timeout"
        if isinstance(error, EngineFailed) or any(p in msg for p in _PEER_PATTERNS):
            return "peer"
        return "other"

    def _engine_error(self) -> str | None:
        pg = self._pg
        if pg is None:
            return None
        try:
            err = pg.get_error()
        except Exception:  # noqa: BLE001 - aborted meanwhile: the communicator already failed its ops
            return None
        name = getattr(err, "name", str(err))
        if name.rsplit(".", 1)[-1] == "SUCCESS":
            return None
        return f"NCCL communicator reported {name}"

    # --- helpers -------------------------------------------------------------------------------
    def _handle(self, work: Any, start: Any = None) -> EngineHandle:
        if work is None:  # a synchronous op c10d issued on the current stream without a work
            work = CurrentStreamWork(self._device, start)
        elif start is not None:
            self._sync_work_given = True  # c10d times its synchronous ops itself
        return StreamOrderedHandle(work, self._poller, self._timed)

    def _issue(self, async_op: bool, call: Callable[..., Any], *args: Any) -> EngineHandle:
        """``call(*args)`` (a c10d collective) and its handle. A timed synchronous op gets an event
        on the current stream just before it: the start of its device time where c10d returns no
        work (so no start event) for it; not recorded once c10d has returned a work for one."""
        start = None
        if not async_op and self._timed and not self._sync_work_given:
            start = torch.Event(self._device, enable_timing=True)
            start.record(torch.accelerator.current_stream(self._device.index))
        return self._handle(call(*args), start)

    def _cached(self, key: tuple[Any, ...], kind: Any, async_op: bool, **fields: Any) -> Any:
        """The c10d options object for ``key`` (made once: c10d takes them by const reference)."""
        opts = self._opts.get(key)
        if opts is None:
            opts = self._opts[key] = _options(kind, async_op, **fields)
        return opts

    # --- point to point ------------------------------------------------------------------------
    # c10d's send/recv take no options: they run on the engine's point-to-point streams
    def send(self, tensor: torch.Tensor, dst: int, tag: int, *, async_op: bool = True) -> EngineHandle:
        return self._handle(self._pg.send([tensor], dst, tag))

    def recv(self, tensor: torch.Tensor, src: int, tag: int, *, async_op: bool = True) -> EngineHandle:
        return self._handle(self._pg.recv([tensor], src, tag))

    def batch_p2p(self, ops: list[tuple[bool, torch.Tensor, int]], tag: int, *, async_op: bool = True) -> EngineHandle:
        """One NCCL group (``ncclGroupStart``/``End``) over every send and receive."""
        pg = self._pg
        pg._start_coalescing(self._device)
        try:
            for is_send, t, peer in ops:
                if is_send:
                    pg.send([t], peer, tag)
                else:
                    pg.recv([t], peer, tag)
        finally:
            work = pg._end_coalescing(self._device)
        return self._handle(work)

    # --- collectives ---------------------------------------------------------------------------
    # ``async_op=False``: on the caller's current stream (see the module docstring)
    def broadcast(self, tensor: torch.Tensor, root: int, *, async_op: bool = True) -> EngineHandle:
        opts = self._cached(("broadcast", root, async_op), dist.BroadcastOptions, async_op, rootRank=root)
        return self._issue(async_op, self._pg.broadcast, [tensor], opts)

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True) -> EngineHandle:
        t = op.type
        opts = self._opts.get(("all_reduce", t, async_op))
        if opts is None:
            opts = self._cached(("all_reduce", t, async_op), dist.AllreduceOptions, async_op, reduceOp=_reduce_op(op))
        if t is RedOpType.PREMUL_SUM:
            premul_in_place(tensor, op)
        return self._issue(async_op, self._pg.allreduce, [tensor], opts)

    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp, *, async_op: bool = True) -> EngineHandle:
        opts = self._cached(("reduce", op.type, root, async_op), dist.ReduceOptions, async_op, reduceOp=_reduce_op(op),
                            rootRank=root)
        premul_in_place(tensor, op)
        return self._issue(async_op, self._pg.reduce, [tensor], opts)

    def all_gather(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor, *,
                   async_op: bool = True) -> EngineHandle:
        opts = self._cached(("all_gather", async_op), dist.distributed_c10d.AllgatherOptions, async_op)
        return self._issue(async_op, self._pg.allgather, [tensor_list], [tensor], opts)

    # c10d's NCCL all-gather and reduce-scatter accept uneven pieces (one coalesced group of
    # broadcasts / reduces): the "v" forms are the same calls
    all_gather_v = all_gather

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, *, async_op: bool = True) -> EngineHandle:
        opts = self._cached(("all_gather", async_op), dist.distributed_c10d.AllgatherOptions, async_op)
        return self._issue(async_op, self._pg._allgather_base, output, input, opts)

    def reduce_scatter(self, output: torch.Tensor, input_list: list[torch.Tensor], op: ReduceOp, *,
                       async_op: bool = True) -> EngineHandle:
        opts = self._cached(("reduce_scatter", op.type, async_op), dist.ReduceScatterOptions, async_op,
                            reduceOp=_reduce_op(op))
        inputs = [premul_scaled(t, op) for t in input_list]
        return self._issue(async_op, self._pg.reduce_scatter, [output], [inputs], opts)

    reduce_scatter_v = reduce_scatter

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, op: ReduceOp, *,
                              async_op: bool = True) -> EngineHandle:
        opts = self._cached(("reduce_scatter", op.type, async_op), dist.ReduceScatterOptions, async_op,
                            reduceOp=_reduce_op(op))
        input = premul_scaled(input, op)
        return self._issue(async_op, self._pg._reduce_scatter_base, output, input, opts)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, *, async_op: bool = True) -> EngineHandle:
        opts = self._cached(("all_to_all", async_op), dist.AllToAllOptions, async_op)
        return self._issue(async_op, self._pg.alltoall_base, output, input, [], [], opts)

    def all_to_all_v_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                            input_split_sizes: list[int], *, async_op: bool = True) -> EngineHandle:
        opts = self._cached(("all_to_all", async_op), dist.AllToAllOptions, async_op)
        return self._issue(async_op, self._pg.alltoall_base, output, input, output_split_sizes, input_split_sizes, opts)

    def all_to_all(self, output_list: list[torch.Tensor], input_list: list[torch.Tensor], *,
                   async_op: bool = True) -> EngineHandle:
        opts = self._cached(("all_to_all", async_op), dist.AllToAllOptions, async_op)
        return self._issue(async_op, self._pg.alltoall, output_list, input_list, opts)

    def barrier(self, *, async_op: bool = True) -> EngineHandle:
        """A one-element all-reduce: stream-ordered like every other op (c10d's own barrier
        blocks the host until the GPU is done)."""
        if self._barrier_buf is None:
            self._barrier_buf = torch.zeros(1, dtype=torch.int32, device=self._device)
        opts = self._cached(("all_reduce", RedOpType.SUM, async_op), dist.AllreduceOptions, async_op,
                            reduceOp=dist.ReduceOp.SUM)
        return self._issue(async_op, self._pg.allreduce, [self._barrier_buf], opts)

    def scatter(self, output: torch.Tensor, input_list: list[torch.Tensor] | None, root: int, *,
                async_op: bool = True) -> EngineHandle:
        opts = self._cached(("scatter", root, async_op), dist.ScatterOptions, async_op, rootRank=root)
        return self._issue(async_op, self._pg.scatter, [output], [input_list] if input_list is not None else [], opts)

    def gather(self, output_list: list[torch.Tensor] | None, input: torch.Tensor, root: int, *,
               async_op: bool = True) -> EngineHandle:
        opts = self._cached(("gather", root, async_op), dist.GatherOptions, async_op, rootRank=root)
        return self._issue(async_op, self._pg.gather, [output_list] if output_list is not None else [], [input], opts)


def _split_color(global_ranks: tuple[int, ...]) -> int:
    """One non-negative 31-bit colour per member set, the same on every member."""
    import zlib

    return zlib.crc32(",".join(map(str, global_ranks)).encode()) & 0x7FFFFFFF
