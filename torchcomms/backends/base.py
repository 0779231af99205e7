"""The contract between ``TorchComm`` and an engine.

A backend only translates: it never validates arguments (``TorchComm`` did), never times
(``TorchWork`` does) and never logs (hooks do). Each op method starts the engine operation
and returns an :class:`EngineHandle` at once.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch

from torchcomms.types import RedOpType, ReduceOp

DoneCallback = Callable[[BaseException | None], None]
# Wait in the engine for at most the given seconds: True once done (raises the engine's error),
# False if the op is still running.
BlockingWait = Callable[[float], bool]
# How long one engine wait lasts before the waiter looks up (deadline, abort, peer failure).
ENGINE_WAIT_SLICE_S = 0.02


def avg_finish(t: torch.Tensor, op: ReduceOp, size: int) -> Callable[[], None] | None:
    """The local step that turns an engine's SUM into ``op``'s AVG over ``size`` ranks (``None``
    for other ops): floats divide; integers divide with truncation, as c10d and the reference do."""
    if op.type is not RedOpType.AVG:
        return None
    if t.is_floating_point() or t.is_complex():
        return lambda: t.div_(size)
    return lambda: t.div_(size, rounding_mode="trunc")


def premul_scaled(t: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    """The input a PREMUL_SUM sends: a copy of ``t`` multiplied by the op's factor, in ``t``'s
    dtype (a one-element tensor factor would otherwise promote a half tensor to the factor's
    dtype, which the engine then reduces as ``t``'s); other ops send ``t`` itself."""
    if op.type is not RedOpType.PREMUL_SUM:
        return t
    with torch.inference_mode():  # the engine's own step, as the collective is: not for autograd
        return torch.mul(t, premul_factor(op)).to(t.dtype)


def premul_in_place(t: torch.Tensor, op: ReduceOp) -> None:
    """Scale ``t`` by a PREMUL_SUM's factor in place (the all-reduce and the reduce root send
    ``t`` itself); nothing for other ops. Outside autograd and its in-place checks, as the
    engine's writes into ``t`` are: ``t`` may be a parameter that requires grad, or a tensor
    made under ``torch.inference_mode()``."""
    if op.type is RedOpType.PREMUL_SUM:
        with torch.inference_mode():
            t.mul_(premul_factor(op))


def premul_factor(op: ReduceOp) -> Any:
    """A PREMUL_SUM's factor as a scalar or a 0-dim tensor, which scales a tensor in place
    whatever its shape and dtype (a one-element tensor of shape ``(1,)`` cannot scale a 0-dim one)."""
    f = op.factor
    return f.reshape(()) if isinstance(f, torch.Tensor) else f


class EngineHandle:
    """Completion of one engine operation.

    ``futures`` are engine futures (``torch.futures.Future``) that complete when the engine is
    done; ``finish`` is a local step run after all of them succeed (e.g. copy-out or the
    division of AVG). With no futures the op completed (or failed) inside the call.
    :meth:`waitable` makes a handle the caller can also block on inside the engine (the
    synchronous fast path); its futures are made only if a callback is asked for.
    """

    __slots__ = ("_futures", "_finish", "_error", "_pending", "_lock", "_callback", "_first_error", "_blocking",
                 "_make_futures")

    #: True for the handle of an op that runs on a device stream (``nccl_completion``'s
    #: ``StreamOrderedHandle``). Such a handle also has ``stream_wait()`` (the caller's current
    #: stream waits on the op; the host goes on), ``urge()`` (a host thread blocks on the op:
    #: report its end promptly) and ``device_duration_ms()`` (the op's time on the device, from
    #: its start and end events, once it ended; ``None`` without timing).
    stream_ordered = False

    def __init__(
        self,
        futures: Sequence[torch.futures.Future] | None = None,
        finish: Callable[[], None] | None = None,
        error: BaseException | None = None,
    ) -> None:
        self._futures: Sequence[torch.futures.Future] = list(futures) if futures else ()
        self._finish = finish
        self._error = error
        self._pending = len(self._futures)
        self._lock = threading.Lock() if self._futures else None  # only _one_done needs it
        self._callback: DoneCallback | None = None
        self._first_error: BaseException | None = None
        self._blocking: list[BlockingWait] | None = None
        self._make_futures: Callable[[], Sequence[torch.futures.Future]] | None = None

    @classmethod
    def completed(cls, finish: Callable[[], None] | None = None) -> EngineHandle:
        return cls(None, finish)

    @classmethod
    def failed(cls, error: BaseException) -> EngineHandle:
        return cls(None, None, error)

    @classmethod
    def waitable(
        cls,
        blocking: Sequence[BlockingWait],
        make_futures: Callable[[], Sequence[torch.futures.Future]],
        finish: Callable[[], None] | None = None,
    ) -> EngineHandle:
        """An op of ``len(blocking)`` engine parts: ``blocking[i](seconds)`` waits for part i in
        the engine; ``make_futures()`` returns the parts' futures, called only by :meth:`on_done`."""
        handle = cls.__new__(cls)  # every field set here: __init__'s futures branch is not needed
        handle._futures = ()
        handle._finish = finish
        handle._error = None
        handle._callback = None
        handle._first_error = None
        handle._blocking = list(blocking)
        handle._make_futures = make_futures
        handle._pending = len(handle._blocking)
        handle._lock = threading.Lock()
        return handle

    @property
    def is_immediate(self) -> bool:
        """True when the op already ended inside the backend call."""
        return self._pending == 0

    @property
    def succeeded_in_call(self) -> bool:
        """True when the op ended successfully inside the backend call, with nothing left to
        run (no error, no ``finish`` step): the caller may complete it without a callback."""
        return self._pending == 0 and self._error is None and self._finish is None

    @property
    def can_wait_in_engine(self) -> bool:
        """True when :meth:`wait_engine` may be used instead of :meth:`on_done`."""
        return self._blocking is not None

    def wait_engine(self, timeout_s: float) -> tuple[bool, BaseException | None]:
        """Block in the engine for at most ``timeout_s`` seconds (the GIL released).

        Returns ``(False, None)`` while the op still runs, else ``(True, error_or_None)`` with
        ``finish`` already run. Use either this or :meth:`on_done` for one handle, not both."""
        assert self._blocking is not None
        deadline = time.monotonic() + timeout_s
        while self._blocking:
            try:
                if not self._blocking[0](max(0.0, deadline - time.monotonic())):
                    return False, None
            except BaseException as e:  # noqa: BLE001 - engine errors arrive as anything
                self._blocking = []
                return True, e
            self._blocking.pop(0)
        return True, self._run_finish(None)

    def wait_until(self, deadline: float) -> BaseException | None:
        """Block until the op ends (returns its error, or ``None``) or ``deadline``
        (``time.monotonic()``) passes (raises ``TimeoutError``; the op goes on)."""
        if self._blocking is not None:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("the engine op did not end before the deadline")
                done, error = self.wait_engine(min(ENGINE_WAIT_SLICE_S, remaining))
                if done:
                    return error
        return self.wait_callback_until(deadline)

    def wait_callback_until(self, deadline: float) -> BaseException | None:
        """:meth:`wait_until` through :meth:`on_done`: the engine reports the op's end to a
        callback, which this waits for until ``deadline`` (``TimeoutError`` then)."""
        ended = threading.Event()
        box: list[BaseException | None] = []

        def done(error: BaseException | None) -> None:
            box.append(error)
            ended.set()

        self.on_done(done)
        if not ended.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError("the engine op did not end before the deadline")
        return box[0]

    def on_done(self, callback: DoneCallback) -> None:
        """Call ``callback(error_or_None)`` exactly once, when the op ends (maybe right now)."""
        if self._make_futures is not None:
            self._futures, self._make_futures, self._blocking = list(self._make_futures()), None, None
        if not self._futures:
            callback(self._run_finish(self._error))
            return
        self._callback = callback
        for fut in self._futures:
            fut.add_done_callback(self._one_done)

    def on_engine_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the engine is done with every part of the op (maybe right
        now), without running ``finish``: for an op the caller stopped waiting for in the
        engine (its deadline passed, or it was failed elsewhere), whose outputs must not be
        written any more. Not together with :meth:`on_done`."""
        if self._make_futures is not None:
            self._futures, self._make_futures, self._blocking = list(self._make_futures()), None, None
        futures = list(self._futures)
        if not futures:
            callback()
            return
        left, lock = [len(futures)], threading.Lock()

        def one(_: torch.futures.Future) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                callback()

        for fut in futures:
            fut.add_done_callback(one)

    def _one_done(self, fut: torch.futures.Future) -> None:
        try:
            fut.value()
            err = None
        except BaseException as e:  # noqa: BLE001 - engine errors arrive as anything
            err = e
        with self._lock:
            if err is not None and self._first_error is None:
                self._first_error = err
            self._pending -= 1
            last = self._pending == 0
        if last:
            assert self._callback is not None
            self._callback(self._run_finish(self._first_error))

    def _run_finish(self, error: BaseException | None) -> BaseException | None:
        if error is None and self._finish is not None:
            try:
                # the engine's local step (AVG's division, a copy into list outputs) writes the
                # op's outputs as the engine does: outside autograd (they may require grad, or be
                # inference tensors, which only inference mode may write in place)
                with torch.inference_mode():
                    self._finish()
            except BaseException as e:  # noqa: BLE001
                return e
        return error


#: the hint an engine with a stream priority (nccl) reads; ``new_comm(is_high_priority_stream=True)``
#: sets it, so split, shrunk and reconfigured children inherit it with the other hints
HIGH_PRIORITY_STREAM_HINT = "nccl.high_priority_stream"


@dataclass
class BackendContext:
    """What a backend is created with.

    ``timeout`` bounds the engine's set-up (its rendezvous; after a shrink, what is left of the
    shrink). It is not an op timeout: ``TorchComm`` ends each op at that op's own deadline, so
    an engine must not end ops sooner by itself (gloo's own limit is set to a backstop).

    ``own_store_client``: the rendezvous goes through a client of ``store``'s host of its own
    where the engine can make one (gloo, over a TCPStore), not through ``store``'s: a TCPStore
    client serves one call at a time, and a shrink's engine may be abandoned while its
    rendezvous waits in a store call, which the shrink's own store calls after it must not
    wait behind."""

    name: str
    rank: int
    size: int
    device: torch.device
    store: Any
    store_prefix: str
    timeout: timedelta
    hints: dict[str, str] = field(default_factory=dict)
    global_ranks: tuple[int, ...] = ()
    own_store_client: bool = False


@dataclass(frozen=True)
class BackendCapabilities:
    """What an engine can do, so ``TorchComm`` and recovery can plan around it."""

    devices: tuple[str, ...] = ("cpu",)
    abort: bool = False
    shrink: bool = False
    split: bool = True
    dtypes: frozenset[torch.dtype] | None = None  # None: every dtype
    bitwise_ops: bool = True
    complex_product: bool = True  # PRODUCT of complex tensors (gloo multiplies only real numbers)
    reconfigure: bool = False
    # op methods take a keyword ``async_op``: a synchronous op is issued on the caller's current
    # device stream (no cross-stream events), an asynchronous one on the engine's own stream
    current_stream_sync: bool = False
    # ops on the same memory run in the order they were issued (a device stream orders them);
    # else the communicator makes a later op wait for an earlier one in flight (core.busy_memory)
    orders_ops_on_shared_memory: bool = False
    recv_any_source: bool = False  # implements recv_any_source()
    # the engine has its own fault-tolerant agreement (``agree``); else ``TorchComm.agree`` uses the store
    agree: bool = False


class TorchCommBackend:
    """Base class of Python backends; register subclasses with ``register_backend``.

    Subclasses implement the op methods below. ``TorchComm`` has validated the arguments:
    tensors are contiguous, on the right device, with consistent shapes and dtypes.
    """

    backend_name: str = "base"
    capabilities: BackendCapabilities = BackendCapabilities()

    def __init__(self, ctx: BackendContext) -> None:
        self.ctx = ctx

    # --- lifecycle -------------------------------------------------------------------------
    @classmethod
    def needs_store(cls, size: int) -> bool:
        """Whether creating this backend needs a rendezvous store for a world of ``size``."""
        return size > 1

    @classmethod
    def is_available(cls) -> bool:
        """Whether the engine exists in this installation."""
        return True

    def init(self) -> None:
        """Connect the engine (rendezvous through ``ctx.store`` under ``ctx.store_prefix``)."""

    def version(self) -> str:
        return torch.__version__

    def engine(self) -> Any:
        """The engine object (``get_backend_impl()``)."""
        return None

    def finalize(self) -> None:
        """Release the engine after all work drained."""

    def abort(self) -> None:
        """Stop using the engine now; must not block or raise."""

    def revoke(self) -> None:
        """A peer's failure broke the communicator: make every peer's pending and later ops on
        this engine fail now (MPI's revoke), so that no survivor waits for this rank until its
        deadline. Called from any thread, the engine's own included: must not block or raise.
        The engine is then aborted, never used again. Engines without such a means do nothing."""

    def split(self, ctx: BackendContext) -> TorchCommBackend:
        """A new backend over a subset of ranks (``ctx`` has the new rank/size/prefix)."""
        child = type(self)(ctx)
        child.init()
        return child

    def split_excluded(self) -> None:
        """Called on each rank left out of a :meth:`split` (whose members call ``split``), for
        engines whose split is collective over every rank of the parent (NCCL's)."""

    def classify_error(self, error: BaseException) -> str:
        """'timeout', 'peer' or 'other' for an engine error."""
        return "other"

    def agree(self, flag: bool, deadline: float) -> bool:
        """The engine's fault-tolerant AND of ``flag`` over its live members, the same on every
        member that returns (engines with ``capabilities.agree`` only); raises ``TimeoutError``
        at ``deadline`` (``time.monotonic()``)."""
        raise NotImplementedError(f"backend '{self.backend_name}' has no agreement of its own")

    # --- operations ------------------------------------------------------------------------
    def _unsupported(self, op: str) -> EngineHandle:
        raise NotImplementedError(f"backend '{self.backend_name}' does not implement {op}")

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> EngineHandle:
        return self._unsupported("send")

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> EngineHandle:
        return self._unsupported("recv")

    def recv_any_source(self, tensor: torch.Tensor, tag: int, found: Callable[[int], None]) -> EngineHandle:
        """A receive from whichever peer sends first; ``found(rank)`` names that peer as soon as
        it is known (before the op completes). Only engines whose capabilities say
        ``recv_any_source`` implement it."""
        return self._unsupported("recv_any_source")

    def batch_p2p(self, ops: list[tuple[bool, torch.Tensor, int]], tag: int) -> EngineHandle:
        """``ops``: (is_send, tensor, peer) in the user's order."""
        return self._unsupported("batch_p2p")

    def broadcast(self, tensor: torch.Tensor, root: int) -> EngineHandle:
        return self._unsupported("broadcast")

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> EngineHandle:
        return self._unsupported("all_reduce")

    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp) -> EngineHandle:
        return self._unsupported("reduce")

    def all_gather(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor) -> EngineHandle:
        return self._unsupported("all_gather")

    def all_gather_v(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor) -> EngineHandle:
        return self._unsupported("all_gather_v")

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor) -> EngineHandle:
        return self._unsupported("all_gather_single")

    def reduce_scatter(self, output: torch.Tensor, input_list: list[torch.Tensor], op: ReduceOp) -> EngineHandle:
        return self._unsupported("reduce_scatter")

    def reduce_scatter_v(self, output: torch.Tensor, input_list: list[torch.Tensor], op: ReduceOp) -> EngineHandle:
        return self._unsupported("reduce_scatter_v")

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, op: ReduceOp) -> EngineHandle:
        return self._unsupported("reduce_scatter_single")

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor) -> EngineHandle:
        return self._unsupported("all_to_all_single")

    def all_to_all_v_single(
        self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int]
    ) -> EngineHandle:
        return self._unsupported("all_to_all_v_single")

    def all_to_all(self, output_list: list[torch.Tensor], input_list: list[torch.Tensor]) -> EngineHandle:
        return self._unsupported("all_to_all")

    def barrier(self) -> EngineHandle:
        return self._unsupported("barrier")

    def scatter(self, output: torch.Tensor, input_list: list[torch.Tensor] | None, root: int) -> EngineHandle:
        return self._unsupported("scatter")

    def gather(self, output_list: list[torch.Tensor] | None, input: torch.Tensor, root: int) -> EngineHandle:
        return self._unsupported("gather")

    def gather_single(self, output: torch.Tensor | None, input: torch.Tensor, root: int, **kw: Any) -> EngineHandle:
        """``gather`` into views of ``output`` (one row a rank); engines with a flat gather override it.
        ``kw``: what dispatch passes the engine's op methods (``async_op`` where the engine takes it)."""
        outs = None
        if output is not None:
            flat = output.view(self.ctx.size, -1)
            outs = [flat[i].view(input.shape) for i in range(self.ctx.size)]
        return self.gather(outs, input, root, **kw)
