"""FSDP's custom collectives, run on torchcomms communicators.

``CommAllGather`` and ``CommReduceScatter`` implement torch's ``AllGather``/``ReduceScatter``
(``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``); ``ReplicaAllReduce`` is
the HSDP all-reduce, installed with ``set_all_reduce_hook``. Each issues its op asynchronously
on its own communicator and returns (or keeps) the handle:

* all-gather: FSDP waits on the returned :class:`~fsdp2.work.CommWork` in its copy-out, so a
  prefetched all-gather runs on its engine while the previous module computes;
* reduce-scatter (and the HSDP all-reduce after it): FSDP does not wait on a reduce-scatter's
  result; when nothing in the rest of ``foreach_reduce`` reads the output (no post-divide, no
  dtype cast, no gradient accumulation, no post-accumulate-grad hooks) the op stays in flight
  until the next module's starts (:class:`Reductions`; the last is waited for at the end of
  backward). Otherwise it is waited before returning, as stock FSDP does.

On gloo both run without gloo's scratch copies of the whole buffer (:data:`COPYING_ENGINES`), so
an op in flight holds no more memory than stock FSDP's waited one.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

import torchcomms
from fsdp2.work import CommWork

_C10D_TO_COMMS = {
    dist.ReduceOp.SUM: "SUM",
    dist.ReduceOp.AVG: "AVG",
    dist.ReduceOp.MAX: "MAX",
    dist.ReduceOp.MIN: "MIN",
    dist.ReduceOp.PRODUCT: "PRODUCT",
}


class FSDPCommError(torchcomms.CommValueError):
    """FSDP handed a collective something the torchcomms path cannot run (named in the message)."""


def _premul_factor(op: Any) -> float | torch.Tensor | None:
    """The factor of c10d's ``ReduceOp.PREMUL_SUM(factor)`` (FSDP's ``1 / gradient_divide_factor``):
    its ``factor`` attribute, or the pickled state ``(kind, factor)`` where that is missing."""
    factor = getattr(op, "factor", None)
    if factor is None and hasattr(op, "__getstate__"):
        state = op.__getstate__()
        if isinstance(state, tuple) and len(state) == 2:
            factor = state[1]
    return factor if isinstance(factor, (float, int, torch.Tensor)) and not isinstance(factor, bool) else None


def comms_op(op: Any) -> torchcomms.ReduceOp:
    """torch's reduce op (a ``dist.ReduceOp`` or its ``RedOpType``) as a torchcomms ``ReduceOp``;
    ``PREMUL_SUM(f)`` keeps its factor (the communicator multiplies by it, then sums)."""
    kind = getattr(op, "op", op)  # dist.ReduceOp wraps a RedOpType in .op
    if kind == dist.ReduceOp.PREMUL_SUM:
        factor = _premul_factor(op)
        if factor is None:
            raise FSDPCommError(f"reduce op {op!r} is a PREMUL_SUM without a readable factor")
        return torchcomms.ReduceOp.PREMUL_SUM(factor)
    for c10d, name in _C10D_TO_COMMS.items():
        if kind == c10d or kind == getattr(c10d, "op", c10d):
            return getattr(torchcomms.ReduceOp, name)
    raise FSDPCommError(f"reduce op {op!r} has no torchcomms equivalent here")


def _check_group(group: dist.ProcessGroup | None, comm: Any, what: str) -> None:
    if group is not None and group.size() != comm.get_size():
        raise FSDPCommError(
            f"{what}: FSDP's group has {group.size()} ranks but communicator "
            f"{comm.get_name()!r} has {comm.get_size()}; the mesh and the communicators disagree")


#: reduce-scatters a backward leaves in flight at most (the newest included): 1 and 2 measured
#: alike in throughput on 16 idle cores, 1 with less memory (docs/bench/fsdp.md)
MAX_REDUCTIONS_IN_FLIGHT = 1


class Reductions:
    """The reduce-scatters and all-reduces left in flight during one backward.

    ``add(work)`` keeps at most ``max_in_flight`` of them in flight: beyond it the oldest is
    waited for first (its unsharded gradient is then freed), so a backward holds the unsharded
    gradients of that many modules, not of every module until its end (stock FSDP keeps one
    reduce-scatter in flight too).
    ``chain(work, then)`` runs ``then`` (issuing the next op) once ``work`` completed, on a
    worker thread, so the main thread keeps computing; ``drain()`` waits for all of it and
    raises the first typed error. The drain is queued on autograd's engine, so it runs before
    ``backward()`` returns: no gradient is read by the optimizer while its reduction is running.
    """

    def __init__(self, max_in_flight: int = MAX_REDUCTIONS_IN_FLIGHT) -> None:
        if max_in_flight < 1:
            raise FSDPCommError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._works: list[CommWork] = []
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []
        self._tasks: queue.Queue[tuple[CommWork, Callable[[], CommWork | None]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._drain_queued = False

    def add(self, work: CommWork) -> None:
        with self._lock:
            self._works.append(work)
            oldest = self._works[:-self.max_in_flight]
            del self._works[:-self.max_in_flight]
        for w in oldest:  # past the bound: wait, so that its input (the unsharded gradient) is freed
            try:
                w.wait()
            except BaseException as e:  # noqa: BLE001 - raised by the drain, like any other
                with self._lock:
                    self._errors.append(e)
        self._queue_drain()

    def chain(self, work: CommWork, then: Callable[[], CommWork | None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run_chains, daemon=True, name="fsdp2-chain")
            self._thread.start()
        self._tasks.put((work, then))
        self._queue_drain()

    def _run_chains(self) -> None:
        while (task := self._tasks.get()) is not None:
            work, then = task
            try:
                work.wait()
                nxt = then()
                if nxt is not None:
                    with self._lock:
                        self._works.append(nxt)
            except BaseException as e:  # noqa: BLE001 - handed to the drain, raised on the main thread
                with self._lock:
                    self._errors.append(e)
            finally:
                self._tasks.task_done()

    def _queue_drain(self) -> None:
        if self._drain_queued:
            return
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self.drain)
            self._drain_queued = True
        except RuntimeError:  # not inside a backward pass: the caller drains explicitly
            pass

    def new_pass(self) -> None:
        """A forward started: the next reduction queues a drain again (a backward that raised
        never ran the one it queued). A spare drain (activation recomputation) finds nothing."""
        self._drain_queued = False

    def pending(self) -> int:
        with self._lock:
            return len(self._works) + self._tasks.unfinished_tasks

    def drain(self) -> None:
        """Wait for every reduction of this backward; raise the first error."""
        self._drain_queued = False
        self._tasks.join()
        with self._lock:
            works, self._works = self._works, []
            errors, self._errors = self._errors, []
        first: BaseException | None = errors[0] if errors else None
        for w in works:
            try:
                w.wait()
            except BaseException as e:  # noqa: BLE001 - keep waiting the rest; raise the first
                first = first or e
        if first is not None:
            raise first

    def close(self) -> None:
        if self._thread is not None:
            self._tasks.put(None)
            self._thread = None


#: engines whose all-gather and reduce-scatter go through scratch copies of the whole
#: unsharded size: gloo's ``_allgather_base`` gathers into scratch tensors and copies them out,
#: its ``_reduce_scatter_base`` all-reduces a copy of the input and copies this rank's chunk out.
#: Each copy lives as long as the op is in flight, beside the next module's compute (stock FSDP
#: waits for gloo's ops, so there they come and go inside the call). On these engines the
#: all-gather is one broadcast per rank straight into FSDP's output (``all_gather_v`` into its
#: chunks) and the reduce-scatter an all-reduce of FSDP's input in place (FSDP's own scratch
#: buffer, never read after: the all-reduce gloo would run, minus the copy). The same bits come
#: out; the all-gather's messages differ (each shard from its owner to every peer, not a ring).
COPYING_ENGINES = frozenset({"gloo"})


class CommAllGather(AllGather):
    """FSDP's parameter all-gather on ``comm``, always asynchronous: FSDP waits on the returned
    work right before it copies the parameters out. ``all_gather_single``, or on an engine of
    :data:`COPYING_ENGINES` ``all_gather_v`` into the output's per-rank chunks.

    ``post_forward``: the communicator of the smaller group that ``reshard_after_forward=n``
    reshards to; FSDP's backward re-gathers over that group (its size tells it apart)."""

    def __init__(self, comm: Any, post_forward: Any = None) -> None:
        self.comm = comm
        self.post_forward = post_forward
        self.into_chunks = comm.get_backend() in COPYING_ENGINES

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False) -> dist.Work | None:
        comm = self.comm
        if self.post_forward is not None and group is not None and group.size() == self.post_forward.get_size():
            comm = self.post_forward
        _check_group(group, comm, "all-gather")
        if self.into_chunks:
            chunks = list(output_tensor.chunk(comm.get_size()))
            return CommWork(comm.all_gather_v(chunks, input_tensor, async_op=True))
        return CommWork(comm.all_gather_single(output_tensor, input_tensor, async_op=True))


class CommReduceScatter(ReduceScatter):
    """FSDP's gradient reduce-scatter on ``comm`` for one FSDP module.

    ``params``: the sharded parameters of that module (read at call time to decide whether the
    op may stay in flight: see the module docstring). ``overlap=False`` always waits.
    """

    def __init__(self, comm: Any, reductions: Reductions, params: Callable[[], list[torch.Tensor]],
                 overlap: bool = True) -> None:
        self.comm = comm
        self.reductions = reductions
        self.params = params
        self.overlap = overlap
        self.in_place = comm.get_backend() in COPYING_ENGINES
        self.last: tuple[CommWork, bool] | None = None  # (work, left in flight) for the all-reduce hook

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def can_defer(self, op: torchcomms.ReduceOp, dtype: torch.dtype) -> bool:
        if not self.overlap or op.type is torchcomms.RedOpType.SUM:
            return False  # a SUM is followed by FSDP's post-divide, which reads the output
        for p in self.params():
            if p.dtype != dtype or p.grad is not None or getattr(p, "_post_accumulate_grad_hooks", None):
                return False
        return True

    def issue(self, output: torch.Tensor, input: torch.Tensor, op: torchcomms.ReduceOp) -> CommWork:
        """Start the reduction of ``input`` into ``output``: ``reduce_scatter_single``, or on an
        engine of :data:`COPYING_ENGINES` the steps that engine takes, minus its copy of the
        input: ``all_reduce`` of ``input`` in place, then this rank's chunk copied (AVG: SUM,
        then the chunk divided) into ``output`` by whoever waits for the returned work first."""
        if not self.in_place:
            return CommWork(self.comm.reduce_scatter_single(output, input, op, async_op=True))
        size = self.comm.get_size()
        chunk = input.view(size, -1)[self.comm.get_rank()]
        if op.type is torchcomms.RedOpType.AVG:  # SUM, then only this rank's chunk divided
            mode = None if input.is_floating_point() or input.is_complex() else "trunc"
            work = self.comm.all_reduce(input, torchcomms.ReduceOp.SUM, async_op=True)
            return CommWork(work, lambda: torch.div(chunk, size, rounding_mode=mode, out=output))
        work = self.comm.all_reduce(input, op, async_op=True)  # PREMUL_SUM scales input in place first
        return CommWork(work, lambda: output.copy_(chunk))

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: Any, async_op: bool = False) -> dist.Work | None:
        _check_group(group, self.comm, "reduce-scatter")
        cop = comms_op(op)
        work = self.issue(output_tensor, input_tensor, cop)
        deferred = self.can_defer(cop, input_tensor.dtype)
        self.last = (work, deferred)
        if not deferred:
            work.wait()
            return None
        self.reductions.add(work)
        if async_op:
            return work
        return None


class ReplicaAllReduce:
    """HSDP's all-reduce of the reduce-scattered gradient across replicas, on ``comm``; FSDP calls
    it (``set_all_reduce_hook``) right after the reduce-scatter of ``reduce_scatter``.

    torch's FSDP sees only the shard group, so the replica step is chosen as stock HSDP chooses
    its all-reduce: AVG while no gradient divide factor is set (the shard group's reduction
    divided by its size), SUM once ``divide_factor()`` returns one (the whole division is then
    the reduce-scatter's PREMUL_SUM, or FSDP's pre/post-divide).

    While ``all_reduce_grads()`` is false (the module's ``set_requires_all_reduce(False)``) the
    replica step is skipped as in stock HSDP: the shard group's reductions are summed in
    :attr:`partial` and added to the next one that is all-reduced. FSDP still accumulates what
    this hook leaves in the output into the gradient, so the output is zeroed (the gradient
    reads zeros until then, where stock leaves it unset).
    """

    def __init__(self, comm: Any, reduce_scatter: CommReduceScatter, reductions: Reductions,
                 divide_factor: Callable[[], float | None] = lambda: None,
                 all_reduce_grads: Callable[[], bool] = lambda: True) -> None:
        self.comm = comm
        self.reduce_scatter = reduce_scatter
        self.reductions = reductions
        self.divide_factor = divide_factor
        self.all_reduce_grads = all_reduce_grads
        self.partial: torch.Tensor | None = None

    def __call__(self, reduce_output: torch.Tensor) -> None:
        last = self.reduce_scatter.last
        self.reduce_scatter.last = None
        in_flight = last is not None and last[1]
        if not self.all_reduce_grads():
            if in_flight:
                last[0].wait()
            if self.partial is None:
                self.partial = reduce_output.clone()
            else:
                self.partial += reduce_output
            reduce_output.zero_()
            return
        partial, self.partial = self.partial, None
        op = torchcomms.ReduceOp.AVG if self.divide_factor() is None else torchcomms.ReduceOp.SUM

        def issue() -> CommWork:
            if partial is not None:
                reduce_output.add_(partial)
            return CommWork(self.comm.all_reduce(reduce_output, op, async_op=True))

        if in_flight:  # the reduce-scatter is still in flight: chain after it
            self.reductions.chain(last[0], issue)
        else:
            issue().wait()
