"""``TorchComm``: the communicator users hold, a thin facade over :class:`CommCore`.

Getters read the core; every operation checks its arguments and calls the one dispatch path
(:func:`torchcomms.core.dispatch.dispatch`); recovery (``shrink``, ``reconfigure``, ``split``)
lives in :mod:`torchcomms.recovery`. ``setup.create.new_comm`` makes communicators.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from torchcomms.backends.base import TorchCommBackend
from torchcomms.core.comm_core import CommCore
from torchcomms.core.dispatch import dispatch
from torchcomms.core.errors import CommTypeError
from torchcomms.core.names import NAMES
from torchcomms.core.op import OpRecord, SenderSlot
from torchcomms.core.state import ABORTED_STATES
from torchcomms.core.types import BatchP2POptions, CommOptions, OpName, P2POp, P2POpType, ReduceOp
from torchcomms.core.work import TorchWork
from torchcomms.recovery import outcome as _outcome
from torchcomms.recovery import reconfigure as _reconfigure
from torchcomms.recovery import shrink as _shrink
from torchcomms.recovery import split as _split
from torchcomms.recovery.engines import signature_check

_Hints = dict[str, str] | None
_Timeout = timedelta | None


class BatchSendRecv:
    """A batch of sends and receives issued together (``comm.batch_op_create()``)."""

    def __init__(self, core: CommCore) -> None:
        self._core = core
        self.ops: list[P2POp] = []

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._core.checker.tensor("send", "tensor", tensor)
        self._core.checker.rank_arg("send", "dst", dst, allow_self=False)
        self.ops.append(P2POp(P2POpType.SEND, tensor, dst))

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self._core.checker.tensor("recv", "tensor", tensor)
        self._core.checker.rank_arg("recv", "src", src, allow_self=False)
        self.ops.append(P2POp(P2POpType.RECV, tensor, src))

    def issue(self, async_op: bool, options: BatchP2POptions | None = None) -> TorchWork:
        """Start every op of the batch; one ``TorchWork`` covers them all."""
        opts = options or BatchP2POptions()
        if not self.ops:
            raise self._core.checker.value_error("batch_p2p", "the batch is empty; add send()/recv() ops before issue()")
        sends = [o.tensor for o in self.ops if o.type is P2POpType.SEND]
        recvs = [o.tensor for o in self.ops if o.type is P2POpType.RECV]
        triples = [(o.type is P2POpType.SEND, o.tensor, o.peer) for o in self.ops]
        return dispatch(self._core, OpName.batch_p2p, async_op, opts.hints, opts.timeout, sends, recvs,
                        self._core.backend.batch_p2p, (triples, 0), is_p2p=True)


class TorchComm:
    """A communicator: every operation goes through the one dispatch path."""

    def __init__(self, backend: TorchCommBackend, options: CommOptions, store: Any) -> None:
        self._core = CommCore(backend, options, store)
        self._core.signatures = signature_check(self._core)

    @classmethod
    def from_core(cls, core: CommCore) -> TorchComm:
        """The facade of ``core`` (recovery builds cores; this makes the communicator of one)."""
        comm = cls.__new__(cls)
        comm._core = core
        if core.signatures is None:
            core.signatures = signature_check(core)
        return comm

    # --- getters and settings --------------------------------------------------------------
    def get_rank(self) -> int:
        return self._core.rank

    def get_size(self) -> int:
        return self._core.size

    def get_name(self) -> str:
        return self._core.name

    def get_device(self) -> torch.device:
        return self._core.device

    def get_options(self) -> CommOptions:
        return self._core.options

    def get_backend(self) -> str:
        return self._core.backend_name

    def get_backend_version(self) -> str:
        return self._core.backend.version()

    def get_backend_impl(self) -> Any:
        return self._core.backend.engine()

    def get_global_ranks(self) -> list[int]:
        """Global (job) rank of each rank of this communicator."""
        return list(self._core.global_ranks)

    def is_abort_supported(self) -> bool:
        return True

    def is_aborted(self) -> bool:
        return self._core.state in ABORTED_STATES

    def is_broken(self) -> bool:
        """True after a timeout or peer failure (until recovered with ``shrink``)."""
        return self._core.broken is not None

    def set_timeout(self, timeout: timedelta) -> None:
        secs = self._core.checker.timeout("set_timeout", timeout)
        if secs is None:
            raise self._core.checker.type_error("set_timeout", "timeout must not be None")
        self._core.timeout_s = secs
        self._core.options.timeout = timedelta(seconds=secs)

    def set_hints(self, hints: dict[str, str]) -> None:
        self._core.checker.hints("set_hints", hints)
        self._core.hints.update(hints)

    def get_hints(self) -> dict[str, str]:
        return dict(self._core.hints)

    # --- hooks and observers ---------------------------------------------------------------
    def register_pre_hook(self, cb: Callable[[OpName, int, OpRecord], Any]) -> RemovableHandle:
        """``cb(name, op_id, record)`` before each op reaches the engine."""
        return self._add_hook(self._core.pre_hooks, cb)

    def register_post_hook(self, cb: Callable[[int, OpRecord], Any]) -> RemovableHandle:
        """``cb(op_id, record)`` when each op ends (``record.state`` says how)."""
        return self._add_hook(self._core.post_hooks, cb)

    def register_abort_hook(self, cb: Callable[[], Any]) -> RemovableHandle:
        """``cb()`` when the communicator aborts or breaks."""
        return self._add_hook(self._core.abort_hooks, cb)

    def _add_hook(self, table: OrderedDict[int, Callable[..., Any]], cb: Callable[..., Any]) -> RemovableHandle:
        if not callable(cb):
            raise CommTypeError(f"hook must be callable, got {type(cb).__name__}", comm=self._core.name)
        handle = RemovableHandle(table)
        table[handle.id] = cb
        return handle

    def add_observer(self, observer: Any) -> None:
        """Follow this communicator and every one split or shrunk from it later
        (``observer.on_new_comm(child)`` is called for each)."""
        self._core.observers.append(observer)

    def remove_observer(self, observer: Any) -> None:
        if observer in self._core.observers:
            self._core.observers.remove(observer)

    def notify_peer_failure(self, failed_global_ranks: list[int], detected_by: str) -> None:
        """Tell the communicator that job ranks failed (from the event bus or the launcher).

        If any is a member, every in-flight op ends with ``PeerFailureError`` at once and the
        communicator is broken."""
        self._core.notify_peer_failure(failed_global_ranks, detected_by)

    # --- recovery (torchcomms.recovery) ----------------------------------------------------
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
        secs = self._core.checker.timeout("shrink", timeout) or self._core.timeout_s
        return _shrink.shrink(self._core, secs, type(self).from_core)

    def agree(self, flag: bool, timeout: timedelta | None = None) -> bool:
        """Fault-tolerant agreement: the AND of ``flag`` over the members not known to have
        failed, the same on every member that returns (like ULFM's ``MPIX_Comm_agree``).
        Collective: every member calls it, in the same order of calls. Works on a broken
        communicator; a member that has not called it by ``timeout`` (default: the
        communicator's) counts as ``False``. Use it to decide whether a step happened."""
        secs = self._core.checker.timeout("agree", timeout) if timeout is not None else self._core.timeout_s
        return _outcome.agree(self._core, flag, secs)

    def get_init_handle(self) -> str:
        """This rank's handle for :meth:`reconfigure` (exchange them out of band)."""
        return _reconfigure.init_handle(self._core)

    def reconfigure(self, uuid: Any, init_handles: list[str], timeout: timedelta | None = None,
                    hints: dict[str, str] | None = None) -> TorchWork:
        """Re-form this communicator over the ranks whose handles are listed (new rank = index of
        this rank's handle). Collective over those ranks; ``uuid`` names the configuration and
        must be the same on all of them. Returns a work that completes when the new engine
        context is ready; ops issued before that raise ``CommAbortedError``."""
        return _reconfigure.reconfigure(self._core, uuid, init_handles, timeout, hints)

    def split(self, ranks: list[int], name: str, hints: dict[str, str] | None = None,
              timeout: timedelta | None = None) -> TorchComm | None:
        """Collective over every rank of this communicator. Members pass the same ``ranks``
        (new rank = index in it) and get the new communicator; non-members pass ``[]`` and get
        ``None``."""
        return _split.split(self._core, ranks, name, hints, timeout, type(self).from_core)

    # --- lifecycle -------------------------------------------------------------------------
    def finalize(self) -> None:
        """Drain outstanding work and release the engine. Idempotent."""
        self._core.finalize()

    def abort(self) -> None:
        """Fail every in-flight and later op with ``CommAbortedError``. Never raises."""
        try:
            self._core.abort()
        except Exception:  # noqa: BLE001
            pass

    def __del__(self) -> None:
        try:
            NAMES.release(self._core.name, self._core)
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        c = self._core
        return f"TorchComm({c.name!r}, backend={c.backend_name}, rank={c.rank}/{c.size}, {c.state})"

    # --- point to point --------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, async_op: bool, hints: _Hints = None,
             timeout: _Timeout = None) -> TorchWork:
        self._core.checker.tensor("send", "tensor", tensor)
        self._core.checker.rank_arg("send", "dst", dst, allow_self=False)
        return dispatch(self._core, OpName.send, async_op, hints, timeout, [tensor], [], self._core.backend.send,
                        (tensor, dst, 0), peer=dst, is_p2p=True)

    def recv(self, tensor: torch.Tensor, src: int, async_op: bool, hints: _Hints = None,
             timeout: _Timeout = None) -> TorchWork:
        self._core.checker.tensor("recv", "tensor", tensor)
        self._core.checker.rank_arg("recv", "src", src, allow_self=False)
        return dispatch(self._core, OpName.recv, async_op, hints, timeout, [], [tensor], self._core.backend.recv,
                        (tensor, src, 0), peer=src, is_p2p=True)

    def recv_any_source(self, tensor: torch.Tensor, async_op: bool, hints: _Hints = None,
                        timeout: _Timeout = None) -> TorchWork:
        """Receive ``tensor`` from whichever rank sends to this one first (c10d's
        ``recv(tensor)`` without ``src``); once it completed, ``work.source_rank()`` names the
        sender. Only on engines that can (gloo); others raise ``CommValueError``."""
        self._core.checker.tensor("recv", "tensor", tensor)
        self._core.checker.any_source("recv")
        slot = SenderSlot()
        return dispatch(self._core, OpName.recv, async_op, hints, timeout, [], [tensor],
                        self._core.backend.recv_any_source, (tensor, 0, slot.found), is_p2p=True, bind=slot.bind)

    def batch_op_create(self) -> BatchSendRecv:
        """A new batch of point-to-point ops."""
        return BatchSendRecv(self._core)

    # --- collectives -----------------------------------------------------------------------
    def broadcast(self, tensor: torch.Tensor, root: int, async_op: bool, hints: _Hints = None,
                  timeout: _Timeout = None) -> TorchWork:
        self._core.checker.rooted("broadcast", root, "tensor", tensor)
        ts = [tensor]  # in place: one list for inputs and outputs (the record describes it once)
        return self._run(OpName.broadcast, async_op, hints, timeout, ts, ts, (tensor, root), root=root)

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, async_op: bool, hints: _Hints = None,
                   timeout: _Timeout = None) -> TorchWork:
        self._core.checker.tensor("all_reduce", "tensor", tensor)
        self._core.checker.reduce_op("all_reduce", op, tensor.dtype)
        ts = [tensor]
        return self._run(OpName.all_reduce, async_op, hints, timeout, ts, ts, (tensor, op), reduce_op=op)

    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp, async_op: bool, hints: _Hints = None,
               timeout: _Timeout = None) -> TorchWork:
        self._core.checker.rooted("reduce", root, "tensor", tensor)
        self._core.checker.reduce_op("reduce", op, tensor.dtype)
        ts = [tensor]
        return self._run(OpName.reduce, async_op, hints, timeout, ts, ts, (tensor, root, op),
                         root=root, reduce_op=op)

    def all_gather(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor, async_op: bool,
                   hints: _Hints = None, timeout: _Timeout = None) -> TorchWork:
        self._core.checker.tensor("all_gather", "tensor", tensor)
        self._core.checker.list_like("all_gather", "tensor_list", tensor_list, "tensor", tensor)
        outs = list(tensor_list)
        return self._run(OpName.all_gather, async_op, hints, timeout, [tensor], outs, (outs, tensor))

    def all_gather_v(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor, async_op: bool,
                     hints: _Hints = None, timeout: _Timeout = None) -> TorchWork:
        self._core.checker.tensor("all_gather_v", "tensor", tensor)
        self._core.checker.v_list("all_gather_v", "tensor_list", tensor_list, "tensor", tensor)
        outs = list(tensor_list)
        return self._run(OpName.all_gather_v, async_op, hints, timeout, [tensor], outs, (outs, tensor))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, async_op: bool,
                          hints: _Hints = None, timeout: _Timeout = None) -> TorchWork:
        self._core.checker.pair("all_gather_single", output, input)
        self._core.checker.numel_ratio("all_gather_single", "output", output, "input", input)
        return self._run(OpName.all_gather_single, async_op, hints, timeout, [input], [output], (output, input))

    def reduce_scatter(self, output: torch.Tensor, input_list: list[torch.Tensor], op: ReduceOp, async_op: bool,
                       hints: _Hints = None, timeout: _Timeout = None) -> TorchWork:
        return self._reduce_scatter(OpName.reduce_scatter, output, input_list, op, async_op, hints, timeout)

    def reduce_scatter_v(self, output: torch.Tensor, input_list: list[torch.Tensor], op: ReduceOp, async_op: bool,
                         hints: _Hints = None, timeout: _Timeout = None) -> TorchWork:
        return self._reduce_scatter(OpName.reduce_scatter_v, output, input_list, op, async_op, hints, timeout)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, op: ReduceOp, async_op: bool,
                              hints: _Hints = None, timeout: _Timeout = None) -> TorchWork:
        return self._reduce_scatter(OpName.reduce_scatter_single, output, input, op, async_op, hints, timeout)

    def _reduce_scatter(self, name: OpName, output: torch.Tensor, inputs: Any, op: ReduceOp, async_op: bool,
                        hints: _Hints, timeout: _Timeout) -> TorchWork:
        """The three reduce-scatters: one check of their arguments, then the op of ``name``."""
        ins = self._core.checker.reduce_scatter(str(name), output, inputs, op)
        engine_inputs = inputs if name is OpName.reduce_scatter_single else ins
        return self._run(name, async_op, hints, timeout, ins, [output], (output, engine_inputs, op), reduce_op=op)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, async_op: bool,
                          hints: _Hints = None, timeout: _Timeout = None) -> TorchWork:
        self._core.checker.all_to_all_single(output, input)
        return self._run(OpName.all_to_all_single, async_op, hints, timeout, [input], [output], (output, input))

    def all_to_all_v_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                            input_split_sizes: list[int], async_op: bool, hints: _Hints = None,
                            timeout: _Timeout = None) -> TorchWork:
        outs, ins = self._core.checker.all_to_all_v_single(output, input, output_split_sizes, input_split_sizes)
        check, row_in, row_out = self._core.signatures, math.prod(input.shape[1:]), math.prod(output.shape[1:])
        bind = None if check is None else lambda rec: check.note_counts(  # elements sent to / expected from each rank
            rec.op_id, [n * row_in for n in ins], [n * row_out for n in outs])
        return self._run(OpName.all_to_all_v_single, async_op, hints, timeout, [input], [output],
                         (output, input, outs, ins), bind=bind)

    def all_to_all(self, output_tensor_list: list[torch.Tensor], input_tensor_list: list[torch.Tensor],
                   async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork:
        self._core.checker.all_to_all(output_tensor_list, input_tensor_list)
        outs, ins = list(output_tensor_list), list(input_tensor_list)
        return self._run(OpName.all_to_all, async_op, hints, timeout, ins, outs, (outs, ins))

    def barrier(self, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork:
        return self._run(OpName.barrier, async_op, hints, timeout, [], [], ())

    def scatter(self, output_tensor: torch.Tensor, input_tensor_list: list[torch.Tensor], root: int,
                async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork:
        ins: list[torch.Tensor] | None = None
        if self._core.checker.rooted("scatter", root, "output_tensor", output_tensor):
            self._core.checker.list_like("scatter", "input_tensor_list", input_tensor_list, "output_tensor", output_tensor)
            ins = list(input_tensor_list)
        return self._run(OpName.scatter, async_op, hints, timeout, ins or [], [output_tensor],
                         (output_tensor, ins, root), root=root)

    def gather(self, output_tensor_list: list[torch.Tensor], input_tensor: torch.Tensor, root: int, async_op: bool,
               hints: _Hints = None, timeout: _Timeout = None) -> TorchWork:
        outs: list[torch.Tensor] | None = None
        if self._core.checker.rooted("gather", root, "input_tensor", input_tensor):
            self._core.checker.list_like("gather", "output_tensor_list", output_tensor_list, "input_tensor", input_tensor)
            outs = list(output_tensor_list)
        return self._run(OpName.gather, async_op, hints, timeout, [input_tensor], outs or [],
                         (outs, input_tensor, root), root=root)

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, root: int, async_op: bool,
                      hints: _Hints = None, timeout: _Timeout = None) -> TorchWork:
        out: torch.Tensor | None = None
        if self._core.checker.rooted("gather_single", root, "input", input):
            self._core.checker.tensor("gather_single", "output", output)
            self._core.checker.same_dtype("gather_single", "output", output, "input", input)
            self._core.checker.numel_ratio("gather_single", "output", output, "input", input)
            out = output
        return self._run(OpName.gather_single, async_op, hints, timeout, [input], [out] if out is not None else [],
                         (out, input, root), root=root)

    def _run(self, name: OpName, async_op: bool, hints: _Hints, timeout: _Timeout, inputs: list[torch.Tensor],
             outputs: list[torch.Tensor], args: tuple[Any, ...], **record: Any) -> TorchWork:
        """A collective: the backend method named like the op, through the dispatch path."""
        core = self._core
        return dispatch(core, name, async_op, hints, timeout, inputs, outputs, getattr(core.backend, name),
                        args, **record)

    # --- introspection for tests (the core's internals under their former names) -----------
    _backend = property(lambda self: self._core.backend)
    _ctx = property(lambda self: self._core.ctx)
    _last_seq = property(lambda self: self._core.last_seq)
    _lock = property(lambda self: self._core.lock)
    _inflight = property(lambda self: self._core.watchdog.inflight)
    _deadlines = property(lambda self: self._core.watchdog.deadlines)
    _wake = property(lambda self: self._core.watchdog.wake,
                     lambda self, cond: setattr(self._core.watchdog, "wake", cond))


__all__ = ["BatchSendRecv", "TorchComm"]
