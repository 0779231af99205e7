"""c10d's backend calls, translated to one communicator's ops (the Python half of
:class:`torchcomms._comms._BackendWrapper`).

The C++ ``_BackendWrapper`` turns every c10d ``Backend`` method into one call of a
:class:`CommForwarder` method. Each issues the matching ``TorchComm`` op with ``async_op=True``
(so it goes through the communicator's dispatch path: validation, hooks, deadline, typed errors)
and returns the op's work; the C++ ``Work`` that c10d sees wraps it. Nothing here talks to an
engine.
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from torchcomms._comms.staging import staged, staged_input, staged_output
from torchcomms.types import ReduceOp

if TYPE_CHECKING:
    from torchcomms._comms.completion import FutureCompleter

# c10d's ReduceOp::RedOpType values (torch/csrc/distributed/c10d/Types.hpp) -> ours.
_C10D_REDUCE = {
    0: ReduceOp.SUM, 1: ReduceOp.AVG, 2: ReduceOp.PRODUCT, 3: ReduceOp.MIN, 4: ReduceOp.MAX,
    5: ReduceOp.BAND, 6: ReduceOp.BOR, 7: ReduceOp.BXOR,
}
_PREMUL_SUM = 8


def reduce_op(arg: tuple[int, float | None, torch.Tensor | None]) -> ReduceOp:
    """Our reduce op for c10d's ``(kind, scalar factor, tensor factor)``."""
    kind, scalar, tensor = arg
    if kind == _PREMUL_SUM:
        return ReduceOp.PREMUL_SUM(tensor if tensor is not None else scalar)
    try:
        return _C10D_REDUCE[kind]
    except KeyError:
        raise ValueError(f"torchcomms: c10d reduce op kind {kind} has no torchcomms equivalent") from None


def _in_memory_order(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself, or, for a dense tensor laid out in another dimension order (channels_last,
    a transpose), the contiguous view of its memory that an element-wise op may run on, as c10d's
    gloo runs it (memory order, as c10d: ranks must agree on the layout). Anything else (a
    strided slice, which c10d's gloo reduces as if it were contiguous: wrong numbers) is left to
    the communicator's validation to refuse."""
    if x.layout != torch.strided or x.is_contiguous():
        return x
    view = x.permute(sorted(range(x.dim()), key=lambda d: -x.stride(d)))
    return view if view.is_contiguous() else x


def _flat_output(o: torch.Tensor) -> torch.Tensor:
    """``o`` as the flat view a single-tensor collective writes, or ``o`` itself when it has none
    (not contiguous), for the communicator's validation to refuse with ``CommValueError``."""
    return o.view(-1) if o.is_contiguous() else o


def _timeout(ms: int | None) -> timedelta | None:
    return None if ms is None else timedelta(milliseconds=ms)


def _group_timeout(comm: Any, timeout: timedelta) -> None:
    """A new group's timeout (``new_group`` / ``split_group``'s ``timeout``) becomes its
    communicator's default for every later op, as on c10d's own backends; c10d's default in its
    place leaves the communicator's (``TORCHCOMM_TIMEOUT_SECONDS``, or inherited on a split)."""
    from torchcomms.setup.bootstrap import c10d_default_timeout

    if timeout.total_seconds() > 0 and not c10d_default_timeout(timeout):
        comm.set_timeout(timeout)


class WorkGroup:
    """Several works seen as one (multi-tensor and coalesced c10d calls)."""

    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        for w in self.works:
            if end is None:
                w.wait()
            elif not w.wait(max(0.0, end - time.monotonic())):
                return False
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self.works)

    def exception(self) -> BaseException | None:
        return next((e for e in (w.exception() for w in self.works) if e is not None), None)

    def source_rank(self) -> int:
        return self.works[0].source_rank()


class DeferredP2P:
    """A send/recv issued inside a coalescing block: it runs in the block's batch, at its end."""

    def __init__(self) -> None:
        self.batch: Any = None

    def _issued(self) -> Any:
        if self.batch is None:
            raise RuntimeError("torchcomms: a send/recv issued inside a coalescing block runs when the block "
                               "ends; wait on the block's work")
        return self.batch

    def wait(self, timeout: float | None = None) -> bool:
        return self._issued().wait(timeout)

    def is_completed(self) -> bool:
        return self.batch is not None and self.batch.is_completed()

    def is_success(self) -> bool:
        return self.batch is not None and self.batch.is_success()

    def exception(self) -> BaseException | None:
        return None if self.batch is None else self.batch.exception()


def _one(works: list[Any]) -> Any:
    return works[0] if len(works) == 1 else WorkGroup(works)


class CommForwarder:
    """One communicator, driven by c10d's ``Backend`` calls."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self._rank = comm.get_rank()
        self._timeout_s = comm.get_options().timeout.total_seconds()
        self._issued = 0
        self._coalesced: list[Any] | None = None
        self._p2p: list[tuple[str, torch.Tensor, int, DeferredP2P]] = []
        self._p2p_copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._completer: FutureCompleter | None = None
        self._lock = threading.Lock()
        self._split_names: dict[str, int] = {}
        self._last_split: tuple[tuple[str, tuple[int, ...]], Any] | None = None
        self._options: Any = None

    # --- bookkeeping ---------------------------------------------------------------------
    def backend_name(self) -> str:
        return str(self.comm.get_backend())

    def options(self) -> Any:
        """c10d's ``backend.options`` (:mod:`torchcomms._comms.options`)."""
        if self._options is None:
            from torchcomms._comms.options import BackendOptions

            self._options = BackendOptions(self.comm, self.backend_name())
        return self._options.get()

    def timeout_ms(self) -> int:
        return int(self._timeout_s * 1000)

    def set_timeout(self, ms: int) -> None:
        self.comm.set_timeout(timedelta(milliseconds=ms))
        self._timeout_s = ms / 1000.0

    def sequence_number(self) -> int:
        return self._issued

    def _track(self, works: list[Any]) -> Any:
        self._last_split = None
        self._issued += len(works)
        if self._coalesced is not None:
            self._coalesced.extend(works)
        return _one(works)

    # --- collectives ---------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], red: tuple, timeout: int | None) -> Any:
        op, t = reduce_op(red), _timeout(timeout)
        if any(x.layout is torch.sparse_coo for x in tensors):  # c10d's gloo sums them (DDP's sparse grads)
            from torchcomms._comms.sparse import all_reduce_sparse

            return self._track([w for x in tensors for w in all_reduce_sparse(self.comm, x, op, t)])
        return self._track([self.comm.all_reduce(_in_memory_order(x), op, True, timeout=t) for x in tensors])

    def broadcast(self, tensors: list[torch.Tensor], root: int, root_tensor: int, timeout: int | None) -> Any:
        """The root only reads its tensor: a view that is not contiguous (a strided slice, an
        expanded tensor) is sent from a contiguous copy (c10d's gloo sends its memory as if it
        were contiguous: wrong numbers; refused on the root alone, it left the others waiting)."""
        t, own = _timeout(timeout), self._rank == root
        bufs = [staged_input(_in_memory_order(x)) if own else _in_memory_order(x) for x in tensors]
        return self._track([self.comm.broadcast(x, root, True, timeout=t) for x in bufs])

    def reduce(self, tensors: list[torch.Tensor], root: int, red: tuple, timeout: int | None) -> Any:
        op, t = reduce_op(red), _timeout(timeout)
        return self._track([self.comm.reduce(_in_memory_order(x), root, op, True, timeout=t) for x in tensors])

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], timeout: int | None) -> Any:
        t = _timeout(timeout)
        works = []
        for outs, x in zip(outputs, inputs):
            even = all(o.shape == x.shape for o in outs)
            fn = self.comm.all_gather if even else self.comm.all_gather_v
            pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
            bufs = [staged_output(o, pairs) for o in outs]
            works.append(staged(fn(bufs, staged_input(x), True, timeout=t), pairs))
        return self._track(works)

    def allgather_into_tensor(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                              timeout: int | None) -> Any:
        t = _timeout(timeout)
        works = []
        for o, x in zip(outputs, inputs):
            pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
            out = _flat_output(staged_output(o, pairs))
            works.append(staged(self.comm.all_gather_single(out, x.reshape(-1), True, timeout=t), pairs))
        return self._track(works)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], red: tuple,
                       timeout: int | None) -> Any:
        op, t = reduce_op(red), _timeout(timeout)
        works = []
        for o, xs in zip(outputs, inputs):
            even = all(x.shape == o.shape for x in xs)
            fn = self.comm.reduce_scatter if even else self.comm.reduce_scatter_v
            works.append(fn(o, [staged_input(x) for x in xs], op, True, timeout=t))
        return self._track(works)

    def reduce_scatter_tensor(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], red: tuple,
                              timeout: int | None) -> Any:
        op, t = reduce_op(red), _timeout(timeout)
        works = []
        for o, x in zip(outputs, inputs):
            pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
            out = _flat_output(staged_output(o, pairs))
            works.append(staged(self.comm.reduce_scatter_single(out, x.reshape(-1), op, True, timeout=t), pairs))
        return self._track(works)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                      input_splits: list[int], timeout: int | None) -> Any:
        t = _timeout(timeout)
        if not output_splits and not input_splits:
            return self._track([self.comm.all_to_all_single(output, input, True, timeout=t)])
        n = self.comm.get_size()
        out_s = list(output_splits) or [output.shape[0] // n] * n
        in_s = list(input_splits) or [input.shape[0] // n] * n
        return self._track([self.comm.all_to_all_v_single(output, input, out_s, in_s, True, timeout=t)])

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], timeout: int | None) -> Any:
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        bufs = [staged_output(o, pairs) for o in outputs]
        work = self.comm.all_to_all(bufs, [staged_input(x) for x in inputs], True, timeout=_timeout(timeout))
        return self._track([staged(work, pairs)])

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], root: int,
               timeout: int | None) -> Any:
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        outs = [staged_output(o, pairs) for o in outputs[0]] if outputs and self._rank == root else []
        work = self.comm.gather(outs, staged_input(inputs[0]), root, True, timeout=_timeout(timeout))
        return self._track([staged(work, pairs)])

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], root: int,
                timeout: int | None) -> Any:
        ins = [staged_input(x) for x in inputs[0]] if inputs and self._rank == root else []
        return self._track([self.comm.scatter(outputs[0], ins, root, True, timeout=_timeout(timeout))])

    def barrier(self, timeout: int | None) -> Any:
        return self._track([self.comm.barrier(True, timeout=_timeout(timeout))])

    def monitored_barrier(self, timeout: int | None, wait_all_ranks: bool) -> None:
        """c10d's ``monitored_barrier`` (blocking; see :mod:`torchcomms._comms.monitored`).
        c10d's default timeout in place of none given means the communicator's."""
        from torchcomms._comms.monitored import monitored_barrier
        from torchcomms.setup.bootstrap import c10d_default_timeout

        t = _timeout(timeout)
        monitored_barrier(self.comm, None if t is None or c10d_default_timeout(t) else t, wait_all_ranks)
        self._last_split = None

    # --- point to point (c10d's tag is not part of the torchcomms API; order matches) -------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self._p2p_op("send", tensors, dst)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self._p2p_op("recv", tensors, src)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        """``comm.recv_any_source`` (raises ``CommValueError`` on engines that cannot); the
        work's ``source_rank()`` is what c10d's ``Work._source_rank()`` returns."""
        if self._coalesced is not None:
            from torchcomms.errors import CommValueError

            raise CommValueError("a recv from any source cannot join a coalescing block (batch_isend_irecv): "
                                 "name the source rank", comm=self.comm.get_name(), op="recv")
        return self._track([self.comm.recv_any_source(x, True) for x in tensors])

    def _p2p_op(self, kind: str, tensors: list[torch.Tensor], peer: int) -> Any:
        """A view that is not contiguous goes through a contiguous copy (a receive's is copied
        back once it arrived): refused on one side only, it would leave the peer waiting in its
        send or receive until the timeout."""
        if self._coalesced is not None:
            deferred = DeferredP2P()
            for x in tensors:
                buf = staged_input(x) if kind == "send" else staged_output(x, self._p2p_copies)
                self._p2p.append((kind, buf, peer, deferred))
            return deferred
        fn = self.comm.send if kind == "send" else self.comm.recv
        works = []
        for x in tensors:
            pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
            buf = staged_input(x) if kind == "send" else staged_output(x, pairs)
            works.append(staged(fn(buf, peer, True), pairs))
        return self._track(works)

    # --- coalescing: collectives run as issued; send/recv join one batch at the end --------
    def start_coalescing(self) -> None:
        if self._coalesced is not None:
            raise RuntimeError("torchcomms: coalescing blocks do not nest")
        self._coalesced = []

    def end_coalescing(self) -> Any:
        if self._coalesced is None:
            raise RuntimeError("torchcomms: end_coalescing without start_coalescing")
        works, self._coalesced = self._coalesced, None
        p2p, self._p2p = self._p2p, []
        copies, self._p2p_copies = self._p2p_copies, []
        if p2p:
            batch = self.comm.batch_op_create()
            for kind, x, peer, _ in p2p:
                (batch.send if kind == "send" else batch.recv)(x, peer)
            work = staged(batch.issue(True), copies)
            self._issued += 1
            for *_, deferred in p2p:
                deferred.batch = work
            works.append(work)
        return WorkGroup(works)

    # --- groups and lifetime ---------------------------------------------------------------
    def split(self, ranks: list[int], name: str, timeout: int | None) -> Any:
        """``comm.split`` for c10d's ``ProcessGroup.split_group``.

        c10d maps both device types (cpu, cuda) of a gloo group to this one backend and calls
        split once per device type; its non-member path calls ``comm.split([])`` once per device
        type too. So every call here is one split collective of the parent (members and
        non-members stay in step), but the repeated call of one ``split_group`` (same c10d name
        and ranks, nothing issued in between) joins it as a non-member and returns the
        communicator the first call made: one communicator per group.
        """
        key = (name, tuple(ranks))
        first, self._last_split = self._last_split, None
        if first is not None and first[0] == key:
            self.comm.split([], "c10d-device-alias", timeout=_timeout(timeout))
            return first[1]
        self._refuse_bad_members(ranks, timeout)
        child = self._split(ranks, timeout)
        if child is not None and timeout is not None:
            _group_timeout(child, _timeout(timeout))
        self._last_split = (key, child)
        return child

    def _refuse_bad_members(self, ranks: list[int], timeout: int | None) -> None:
        """Raises ``CommValueError`` for a member list with a rank out of range or twice
        (``new_group([0, 5])``), after taking part as a non-member in each split of the call (one
        per device type of the parent group, on that device type's communicator:
        :mod:`torchcomms._comms.split_parent`), as c10d's non-member path for that group does on
        the ranks it left out: raised before that, those ranks waited in the split until the
        timeout and the parent communicator was broken."""
        size = self.comm.get_size()
        wrong = sorted({r for r in ranks if not 0 <= r < size})
        if not wrong and len(set(ranks)) == len(ranks):
            return
        from torchcomms._comms.split_parent import split_call_comms
        from torchcomms.errors import CommValueError

        for comm in split_call_comms(self.comm):
            comm.split([], "c10d-refused-split", timeout=_timeout(timeout))
        what = f"ranks {wrong} out of range for a group of {size}" if wrong else "a rank listed twice"
        raise CommValueError(f"cannot make a group of ranks {list(ranks)}: {what}", comm=self.comm.get_name(),
                             op="split")

    def _split(self, ranks: list[int], timeout: int | None) -> Any:
        # The new communicator's name must be the same on every member (its engine meets under
        # it), and c10d's group name is not: its hashed names count the groups each process
        # joined. So it is derived from the parent and the member ranks, numbered by how often
        # this parent was split over those ranks (which every member saw equally often).
        members = list(ranks) if self._rank in ranks else []
        key = ",".join(map(str, ranks))
        k = self._split_names.get(key, 0)
        self._split_names[key] = k + 1
        digest = hashlib.sha1(key.encode()).hexdigest()[:12]
        return self.comm.split(members, f"{self.comm.get_name()}/{len(ranks)}r-{digest}#{k}",
                               timeout=_timeout(timeout))

    def abort(self) -> None:
        self.comm.abort()

    def shutdown(self) -> None:
        from torchcomms.errors import CommError

        try:
            self.comm.finalize()
        except CommError:
            self.comm.abort()
        if self._completer is not None:
            # its threads end here, not during the interpreter's finalization
            self._completer.close(self._timeout_s)

    # --- futures ----------------------------------------------------------------------------
    def on_done(self, work: Any, done: Callable[[BaseException | None], None]) -> None:
        """Call ``done(error or None)`` once ``work`` ended (bounded by its deadline); see
        :mod:`torchcomms._comms.completion`."""
        with self._lock:
            if self._completer is None:
                from torchcomms._comms.completion import FutureCompleter

                self._completer = FutureCompleter(self.comm.get_name())
        self._completer.add(work, done)
