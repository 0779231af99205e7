"""The MPI engine: our ops as mpi4py calls on CPU tensors.

Ranks come from the MPI job (``mpiexec -n N python train.py``): the communicator's rank and size
(discovered from ``OMPI_COMM_WORLD_RANK``/``_SIZE`` or ``PMI_RANK``/``_SIZE``) must be the MPI
world's, and no store is needed. Tensor memory is handed to MPI without a copy. Point-to-point
ops are nonblocking (``Isend``/``Irecv``), polled by the caller or the progress thread.
Collectives are MPI's nonblocking calls started on the caller's thread wherever those keep pace
with the blocking ones (every size for most; up to 64 KiB for reduce and per-rank-count
reduce-scatter); the others are MPI's blocking calls run in order on the communicator's engine
thread (see :mod:`.hints`, which also names the hints that move the bound, and
:mod:`.engine_thread`). Either way a caller waits in slices and never past its op's deadline.
Ops MPI lacks are composed (AVG = SUM then divide, PREMUL_SUM = scale then SUM, the list forms
= one packed buffer). Sub-communicators come from
``MPI_Comm_create_group`` (collective over the members only, as ``split`` is). Failures: MPI's
errors are returned, not fatal; with ULFM a failed peer is reported as a peer failure, the
communicator is revoked so that no survivor stays blocked, and ``shrink`` is
``MPI_Comm_ishrink`` followed by ``MPI_Comm_iagree`` (see :mod:`.recovery`).
"""
from __future__ import annotations

import array
import atexit
import dataclasses
import sys
import threading
import zlib
from collections.abc import Callable
from typing import Any

import torch

from torchcomms.backends.base import (BackendCapabilities, BackendContext, EngineHandle, TorchCommBackend, avg_finish,
                                      premul_in_place, premul_scaled)
from torchcomms.backends.mpi import engine as mpi_engine
from torchcomms.backends.mpi.buffers import MPI_DTYPES, Buffers, too_many_elements
from torchcomms.backends.mpi.engine_thread import EngineThread
from torchcomms.backends.mpi.creation import CreationSteps
from torchcomms.backends.mpi.hints import UNEVEN
from torchcomms.backends.mpi.p2p import Arrivals, ProbedRecv, mpi_requests, send_tag
from torchcomms.backends.mpi.progress import RequestProgress, blocking_wait
from torchcomms.backends.mpi.recovery import agree_flag, shrink_comm
from torchcomms.errors import CommValueError
from torchcomms.types import RedOpType, ReduceOp

#: how long finalize() waits for the engine thread to free the communicator (its work has drained)
_FREE_WAIT_S = 10.0
_RUNTIME: dict[str, Any] = {}  # the process's MPI module, buffer tables and progress thread (made once)


def _runtime() -> tuple[Any, Buffers, RequestProgress]:
    if not _RUNTIME:
        MPI = mpi_engine.load_mpi()  # noqa: N806
        _RUNTIME.update(MPI=MPI, buffers=Buffers(MPI), progress=RequestProgress(MPI), stuck=[])
        atexit.register(_end_job_if_stuck)  # runs before mpi4py's MPI_Finalize
    return _RUNTIME["MPI"], _RUNTIME["buffers"], _RUNTIME["progress"]


def _allreduce_keeps_pace(MPI: Any, world: Any, name: str, steps: CreationSteps) -> bool:  # noqa: N803
    """Whether the nonblocking all-reduce keeps pace with the blocking one (see
    :func:`.engine.nonblocking_allreduce_keeps_pace`), found once, as the first world
    communicator is made (collective), from every rank's libnbc algorithm: ranks whose choices
    differ are refused, as their nonblocking all-reduces would never match (Open MPI's own
    ``MPI_Comm_dup`` runs one: it would hang there). The all-gather is one of ``steps``, bounded."""
    if "allreduce_keeps_pace" not in _RUNTIME:
        own = array.array("i", [mpi_engine.libnbc_allreduce_choice()])
        choices = array.array("i", [0]) * world.Get_size()
        req = steps.start(lambda: world.Iallgather([own, MPI.INT], [choices, MPI.INT]), world)
        steps.wait(req, (own, choices), "the ranks' first all-gather", world)
        mine = own[0]
        if len(set(choices)) > 1:
            shown = ", ".join(f"rank {r}: {c if c >= 0 else 'unreadable'}" for r, c in enumerate(choices))
            raise CommValueError(
                f"the ranks chose different libnbc all-reduce algorithms ({mpi_engine.LIBNBC_ALLREDUCE_VAR}; "
                f"0 = unset) before MPI started: {shown}. Their nonblocking all-reduces would never match; set it "
                "alike on every rank, or leave it unset and let torchcomms initialise MPI (it chooses "
                f"{mpi_engine.LIBNBC_ALLREDUCE_DEFAULT})", comm=name, op="new_comm")
        _RUNTIME["allreduce_keeps_pace"] = mpi_engine.nonblocking_allreduce_keeps_pace(MPI, mine)
    return _RUNTIME["allreduce_keeps_pace"]


def _end_job_if_stuck() -> None:
    """At exit: ``MPI_Finalize`` would wait forever for an aborted communicator's engine thread
    or request that is still blocked on a stopped peer (an MPI without ULFM cannot release it),
    so the job is ended with ``MPI_Abort`` and a message saying why, instead of hanging."""
    stuck = [name for name, busy in _RUNTIME.get("stuck", []) if busy()]
    if stuck:
        print(f"torchcomms: exiting while MPI communicator(s) {', '.join(stuck)} are blocked on a failed or stopped "
              f"peer; this MPI cannot release them (no ULFM: launch with '{mpi_engine.ULFM_LAUNCH}'), so the job "
              "is ended with MPI_Abort", file=sys.stderr, flush=True)
        _RUNTIME["MPI"].COMM_WORLD.Abort(1)


class MpiBackend(TorchCommBackend):
    backend_name = "mpi"
    # shrink and agree need ULFM: each instance states whether this job has it (see init)
    capabilities = BackendCapabilities(devices=("cpu",), abort=True, shrink=True, dtypes=MPI_DTYPES,
                                       recv_any_source=True)

    @classmethod
    def needs_store(cls, size: int) -> bool:
        return False  # MPI's own launcher connected the ranks

    @classmethod
    def is_available(cls) -> bool:
        return mpi_engine.mpi4py_installed()

    def __init__(self, ctx: BackendContext, comm: Any = None, paths_agreed: bool = False) -> None:
        super().__init__(ctx)
        self._comm = comm  # set by split/shrink; made from MPI_COMM_WORLD by init() otherwise
        self._paths_agreed = paths_agreed  # the ranks' hints were compared already (a shrink keeps them)

    # --- lifecycle ---------------------------------------------------------------------------
    def init(self) -> None:
        MPI, self._buf, self._progress = _runtime()  # noqa: N806
        self.MPI = MPI
        self._ft = mpi_engine.ulfm_enabled(MPI)
        self._failure_classes = mpi_engine.peer_failure_classes(MPI)
        self._aborted = False
        self._thread: EngineThread | None = None
        self._last_reqs: list[Any] = []  # the requests of the latest op started on the caller's thread
        # per source, the latest receive (see .p2p.ProbedRecv): a later one from there takes a
        # message only after it did
        self._last_recv: dict[int, ProbedRecv] = {}
        self._recv_lock = threading.Lock()
        self.capabilities = dataclasses.replace(type(self).capabilities, shrink=self._ft, agree=self._ft)
        if not mpi_engine.thread_level_ok(MPI):
            raise CommValueError(
                "the mpi backend needs MPI_THREAD_MULTIPLE, but MPI was initialised with a lower thread level "
                "(initialise it through torchcomms, or set mpi4py.rc.thread_level = 'multiple' first)",
                comm=self.ctx.name, op="new_comm")
        # each step is MPI's nonblocking call, bounded by the creation's timeout (see .creation)
        steps = CreationSteps(MPI, self.ctx.name, self.ctx.timeout.total_seconds(), self._ft, self._on_error,
                              self._progress.abandoned)
        if self._comm is None:
            world = MPI.COMM_WORLD
            if (world.Get_rank(), world.Get_size()) != (self.ctx.rank, self.ctx.size):
                raise CommValueError(
                    f"the mpi backend runs on the ranks of an MPI job, but this process is rank "
                    f"{world.Get_rank()} of an MPI world of {world.Get_size()} while the job's rank/size from the "
                    f"environment is {self.ctx.rank}/{self.ctx.size}. Start the ranks with "
                    f"'mpiexec -n {self.ctx.size} python script.py' (add --with-ft ulfm for shrink), or under the "
                    f"launcher with 'mpiexec -n {self.ctx.size} torchcomms-run --backend mpi script.py' (plain "
                    "torchcomms-run starts ranks that are not one MPI job)",
                    comm=self.ctx.name, op="new_comm")
            _allreduce_keeps_pace(MPI, world, self.ctx.name, steps)  # before Idup, which uses the nonblocking all-reduce
            comm, req = steps.start(world.Idup, world)
            steps.wait(req, comm, "MPI_Comm_idup", world)
            self._comm = comm
        self._comm.Set_errhandler(MPI.ERRORS_RETURN)
        self._paths = steps.agree_on_paths(self._comm, self.ctx.hints, _RUNTIME.get("allreduce_keeps_pace", False),
                                           self._paths_agreed)

    def version(self) -> str:
        return mpi_engine.library_version(_runtime()[0])

    def engine(self) -> Any:
        """The ``mpi4py.MPI.Comm`` the ops run on."""
        return self._comm

    def finalize(self) -> None:
        """Release the communicator (its engine thread frees it after its last job)."""
        comm = self._comm
        if comm is None or self._aborted:
            return
        if self._thread is not None:
            # the thread frees it after its last job; waited for, so that nothing of this
            # communicator calls into MPI after finalize() returned (MPI_Finalize may follow)
            self._thread.submit(comm.Free)
            self._thread.stop()
            self._thread.join(_FREE_WAIT_S)
        else:
            try:
                comm.Free()
            except self.MPI.Exception:
                pass

    def abort(self) -> None:
        """Stop using the communicator now. With ULFM it is revoked: every peer's pending and
        later ops on it fail at once. Without, its pending requests are abandoned (kept, with
        their buffers, for as long as the process lives)."""
        try:
            if self._aborted:
                return
            self._aborted = True
            self.revoke()
            pending = [p.requests for p in self._progress.abandon(self)] + [self._last_reqs]
            if self._thread is not None:
                self._thread.stop(mpi_engine.MpiEngineError("the communicator was aborted"))
            if not self._ft:
                _RUNTIME["stuck"].append((self.ctx.name, lambda: self._unfinished(pending)))
        except Exception:  # noqa: BLE001 - abort never raises
            pass

    def _unfinished(self, pending: list[list[Any]]) -> bool:
        """True while an op of this aborted communicator may still be blocked in MPI on a peer."""
        if self._thread is not None and self._thread.busy():
            return True
        try:
            return any(live and not self.MPI.Request.Testall(live) for live in map(mpi_requests, pending))
        except self.MPI.Exception:
            return False  # ended, with an error

    def revoke(self) -> None:
        """With ULFM, revoke the communicator (peers' ops on it fail with ``MPI_ERR_REVOKED``)."""
        if self._ft and self._comm is not None:
            try:
                if not self._comm.Is_revoked():
                    self._comm.Revoke()
            except Exception:  # noqa: BLE001 - already revoked or freed
                pass

    def classify_error(self, error: BaseException) -> str:
        if isinstance(error, mpi_engine.MpiEngineError):
            return error.kind
        if isinstance(error, self.MPI.Exception):
            return "peer" if error.Get_error_class() in self._failure_classes else "other"
        return "other"

    def _on_error(self, error: BaseException) -> BaseException:
        """An MPI error of one of this communicator's ops: a peer's failure revokes the
        communicator, so that peers blocked in other ops on it are released too."""
        wrapped = mpi_engine.wrap_mpi_error(self.MPI, error)
        if wrapped.kind != "peer" and self._revoked():
            # libnbc reports a revoke met inside a started collective as MPI_ERR_OTHER
            return mpi_engine.MpiEngineError(f"the communicator was revoked by a peer (ULFM): {wrapped}",
                                             getattr(self.MPI, "ERR_REVOKED", None), "peer")
        if wrapped.kind == "peer":
            self.revoke()
        return wrapped

    def _revoked(self) -> bool:
        """True when ULFM revoked this communicator (a peer aborted it, or failed)."""
        try:
            return bool(self._ft and self._comm is not None and self._comm.Is_revoked())
        except Exception:  # noqa: BLE001 - freed
            return False

    def split(self, ctx: BackendContext) -> MpiBackend:
        """``MPI_Comm_create_group`` over the members (``ctx.global_ranks``), called by the members only."""
        parent = self.ctx.global_ranks or tuple(range(self.ctx.size))
        members = [parent.index(g) for g in ctx.global_ranks]
        group = self._comm.Get_group()
        try:
            sub = group.Incl(members)
            try:
                tag = zlib.crc32(ctx.store_prefix.encode()) & 0x7FFF
                comm = self._comm.Create_group(sub, tag)
            finally:
                sub.Free()
        except self.MPI.Exception as e:
            raise self._on_error(e) from None
        finally:
            group.Free()
        child = MpiBackend(ctx, comm)
        child.init()
        return child

    def shrink_survivors(self, deadline: float) -> tuple[MpiBackend, list[int]]:
        """The survivors' communicator (ULFM) and their job ranks; see :func:`.recovery.shrink_comm`."""
        comm, survivors = shrink_comm(self.MPI, self._comm, self._ft, list(self.ctx.global_ranks), deadline)
        ctx = dataclasses.replace(self.ctx, rank=comm.Get_rank(), size=comm.Get_size(), global_ranks=tuple(survivors))
        child = MpiBackend(ctx, comm, paths_agreed=True)
        child.init()
        return child, survivors

    def agree(self, flag: bool, deadline: float) -> bool:
        """``MPI_Comm_iagree`` over the live processes (ULFM); see :func:`.recovery.agree_flag`."""
        return agree_flag(self.MPI, self._comm, flag, deadline, self._progress.abandoned)

    # --- helpers -----------------------------------------------------------------------------
    def _start(self, call: Callable[[], Any], keep: Any = None, finish: Callable[[], None] | None = None,
               thread: EngineThread | None = None, status: Any = None) -> EngineHandle:
        """Start the nonblocking MPI call(s) of one op on the caller's thread (with ``thread``:
        only if nothing is queued there, else as a job there that waits for them); ``keep``
        holds its buffers until it ends."""
        try:
            started, reqs = (True, call()) if thread is None else thread.start_inline(call)
        except (self.MPI.Exception, OverflowError) as e:
            raise (too_many_elements(keep, self.ctx.name) or self._on_error(e)) from None
        if not started:
            assert thread is not None
            job = thread.submit(self._counted(lambda: call().Wait(), keep), keep)
            return EngineHandle.waitable([job.wait], lambda: [job.future()], finish)
        if not isinstance(reqs, list):
            reqs = [reqs]
        self._last_reqs = reqs
        on_error = self._on_error
        return EngineHandle.waitable(
            [blocking_wait(self.MPI, reqs, on_error, status)],
            lambda: [self._progress.submit(reqs, self, keep, on_error, status)],
            finish,
        )

    def _coll(self, name: str, nbytes: int, args: tuple[Any, ...], keep: Any = None,
              finish: Callable[[], None] | None = None) -> EngineHandle:
        """Collective ``name`` (mpi4py's nonblocking method, e.g. ``"Iallreduce"``) of ``nbytes``
        (the same on every rank; ``UNEVEN`` where ranks' sizes differ): up to the method's limit
        (:mod:`.hints`) the nonblocking call, started on the caller's thread and polled; above it
        the blocking call on the engine thread. Every rank makes the same choice (MPI's
        nonblocking collectives do not match its blocking ones)."""
        if nbytes <= self._paths.limit(name):
            method = getattr(self._comm, name)
            return self._start(lambda: method(*args), keep, finish, self._thread)
        if self._thread is None:
            self._thread = EngineThread(self.ctx.name, self._on_error, self.MPI.Exception)
        method = getattr(self._comm, name[1].upper() + name[2:])  # "Iallreduce" -> "Allreduce"
        job = self._thread.submit(self._counted(lambda: method(*args), keep), keep)
        return EngineHandle.waitable([job.wait], lambda: [job.future()], finish)

    def _counted(self, call: Callable[[], Any], keep: Any) -> Callable[[], Any]:
        """``call`` for the engine thread, whose failure on a buffer past MPI's count limit
        raises that (a ``CommValueError``) instead of MPI's bare ``MPI_ERR_ARG``/``MPI_ERR_COUNT``."""
        def run() -> Any:
            try:
                return call()
            except (self.MPI.Exception, OverflowError):
                err = too_many_elements(keep, self.ctx.name)
                if err is None:
                    raise
                raise err from None

        return run

    def _avg(self, t: torch.Tensor, op: ReduceOp) -> Callable[[], None] | None:
        return avg_finish(t, op, self.ctx.size)

    @staticmethod
    def _pack(ts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in ts]) if ts else torch.empty(0, dtype=dtype)

    @staticmethod
    def _unpack(flat: torch.Tensor, outs: list[torch.Tensor]) -> Callable[[], None]:
        def unpack() -> None:
            for t, piece in zip(outs, flat.split([o.numel() for o in outs])):
                t.copy_(piece.view(t.shape))

        return unpack

    # --- point to point ----------------------------------------------------------------------
    # A send's tag carries its dtype and a receive takes any tag from its source by a matched
    # probe, so that the receiver can check the message's dtype and size before it posts a
    # buffer (see :mod:`.p2p`).
    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> EngineHandle:
        return self._start(lambda: self._comm.Isend(self._buf.spec(tensor), dst, send_tag(tag, tensor)), tensor)

    def _probed_recv(self, tensor: torch.Tensor, src: int | None) -> ProbedRecv:
        """A receive from ``src`` (``None``: any source), after the latest receive that a
        message it could take could also match. A buffer MPI cannot count is refused here: its
        receive would otherwise fail only once a message came, and no sender sends one."""
        too_many = too_many_elements(tensor, self.ctx.name)
        if too_many is not None:
            raise too_many
        with self._recv_lock:
            if src is None:
                after = [r for r in set(self._last_recv.values()) if not r.matched]
                src = self.MPI.ANY_SOURCE
                op = ProbedRecv(self.MPI, self._comm, tensor, src, self._buf.spec, after)
                for peer in range(self.ctx.size):
                    if peer != self.ctx.rank:
                        self._last_recv[peer] = op
                return op
            last = self._last_recv.get(src)
            op = ProbedRecv(self.MPI, self._comm, tensor, src, self._buf.spec,
                            [last] if last is not None and not last.matched else [])
            self._last_recv[src] = op
            return op

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> EngineHandle:
        status = self.MPI.Status()
        arrivals = Arrivals(self.MPI, [(tensor, status)], self.ctx.rank, self.ctx.name, "recv")
        return self._start(lambda: self._probed_recv(tensor, src), tensor, finish=arrivals.verify, status=status)

    def recv_any_source(self, tensor: torch.Tensor, tag: int, found: Callable[[int], None]) -> EngineHandle:
        """A receive from ``MPI_ANY_SOURCE``; the sender, read from the request's status once
        it completed, is passed to ``found`` before the op is reported done. Every receive issued
        after it takes its message only after this one took its own."""
        status = self.MPI.Status()
        arrivals = Arrivals(self.MPI, [(tensor, status)], self.ctx.rank, self.ctx.name, "recv")

        def finish() -> None:
            found(status.Get_source())
            arrivals.verify()

        return self._start(lambda: self._probed_recv(tensor, None), tensor, finish=finish, status=status)

    def batch_p2p(self, ops: list[tuple[bool, torch.Tensor, int]], tag: int) -> EngineHandle:
        c, spec = self._comm, self._buf.spec
        statuses = [self.MPI.Status() for _ in ops]
        arrivals = Arrivals(self.MPI, [(t, st) for (is_send, t, _), st in zip(ops, statuses) if not is_send],
                            self.ctx.rank, self.ctx.name, "batch_p2p")
        return self._start(
            lambda: [c.Isend(spec(t), p, send_tag(tag, t)) if is_send else self._probed_recv(t, p)
                     for is_send, t, p in ops],
            ops, finish=arrivals.verify if arrivals.recvs else None, status=statuses)

    # --- collectives -------------------------------------------------------------------------
    def broadcast(self, tensor: torch.Tensor, root: int) -> EngineHandle:
        return self._coll("Ibcast", tensor.nbytes, (self._buf.spec(tensor), root), tensor)

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> EngineHandle:
        red = op.type
        if red is RedOpType.PREMUL_SUM:
            premul_in_place(tensor, op)  # in place: the result overwrites it
        return self._coll("Iallreduce", tensor.nbytes,
                          (self.MPI.IN_PLACE, self._buf.spec(tensor), self._buf.op(red, tensor.dtype)), tensor,
                          self._avg(tensor, op) if red is RedOpType.AVG else None)

    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp) -> EngineHandle:
        mop = self._buf.op(op.type, tensor.dtype)
        if self.ctx.rank == root:
            premul_in_place(tensor, op)
            return self._coll("Ireduce", tensor.nbytes, (self.MPI.IN_PLACE, self._buf.spec(tensor), mop, root), tensor,
                              self._avg(tensor, op))
        src = premul_scaled(tensor, op)  # a non-root's tensor is left as it was
        return self._coll("Ireduce", src.nbytes, (self._buf.spec(src), None, mop, root), src)

    def all_gather(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor) -> EngineHandle:
        flat = torch.empty(tensor.numel() * self.ctx.size, dtype=tensor.dtype)
        return self._coll("Iallgather", tensor.nbytes, (self._buf.spec(tensor), self._buf.spec(flat)), (tensor, flat),
                          self._unpack(flat, tensor_list))

    def all_gather_v(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor) -> EngineHandle:
        counts = [t.numel() for t in tensor_list]
        flat = torch.empty(sum(counts), dtype=tensor.dtype)
        return self._coll("Iallgatherv", flat.nbytes, (self._buf.spec(tensor), self._buf.vspec(flat, counts)), (tensor, flat),
                          self._unpack(flat, tensor_list))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor) -> EngineHandle:
        return self._coll("Iallgather", input.nbytes, (self._buf.spec(input), self._buf.spec(output)), (input, output))

    def reduce_scatter(self, output: torch.Tensor, input_list: list[torch.Tensor], op: ReduceOp) -> EngineHandle:
        """Equal parts: MPI's reduce-scatter-block on the packed list (its nonblocking form keeps
        pace with the blocking call; the per-rank-counts form does not, see :mod:`.hints`)."""
        return self.reduce_scatter_single(output, self._pack(input_list, output.dtype), op)

    def reduce_scatter_v(self, output: torch.Tensor, input_list: list[torch.Tensor], op: ReduceOp) -> EngineHandle:
        flat = premul_scaled(self._pack(input_list, output.dtype), op)
        counts = [t.numel() for t in input_list]
        mop = self._buf.op(op.type, output.dtype)
        return self._coll("Ireduce_scatter", flat.nbytes, (self._buf.spec(flat), self._buf.spec(output), counts, mop),
                          (flat, output), self._avg(output, op))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, op: ReduceOp) -> EngineHandle:
        src = premul_scaled(input, op)
        mop = self._buf.op(op.type, output.dtype)
        return self._coll("Ireduce_scatter_block", src.nbytes, (self._buf.spec(src), self._buf.spec(output), mop),
                          (src, output), self._avg(output, op))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor) -> EngineHandle:
        return self._coll("Ialltoall", input.nbytes, (self._buf.spec(input), self._buf.spec(output)), (input, output))

    def all_to_all_v_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                            input_split_sizes: list[int]) -> EngineHandle:
        row_in = input.numel() // max(input.shape[0], 1) if input.dim() else 1
        row_out = output.numel() // max(output.shape[0], 1) if output.dim() else 1
        sc = [s * row_in for s in input_split_sizes]
        rc = [s * row_out for s in output_split_sizes]
        return self._coll("Ialltoallv", UNEVEN, (self._buf.vspec(input, sc), self._buf.vspec(output, rc)),
                          (input, output))

    def all_to_all(self, output_list: list[torch.Tensor], input_list: list[torch.Tensor]) -> EngineHandle:
        dtype = (input_list or output_list)[0].dtype
        send = self._pack(input_list, dtype)
        recv = torch.empty(sum(t.numel() for t in output_list), dtype=dtype)
        sc, rc = [t.numel() for t in input_list], [t.numel() for t in output_list]
        return self._coll("Ialltoallv", UNEVEN, (self._buf.vspec(send, sc), self._buf.vspec(recv, rc)), (send, recv),
                          self._unpack(recv, output_list))

    def barrier(self) -> EngineHandle:
        return self._coll("Ibarrier", 0, ())

    def scatter(self, output: torch.Tensor, input_list: list[torch.Tensor] | None, root: int) -> EngineHandle:
        flat = self._pack(input_list, output.dtype) if input_list is not None else None
        send = self._buf.spec(flat) if flat is not None else None
        return self._coll("Iscatter", output.nbytes, (send, self._buf.spec(output), root), (flat, output))

    def gather(self, output_list: list[torch.Tensor] | None, input: torch.Tensor, root: int) -> EngineHandle:
        if output_list is None:
            return self._coll("Igather", input.nbytes, (self._buf.spec(input), None, root), input)
        flat = torch.empty(input.numel() * self.ctx.size, dtype=input.dtype)
        return self._coll("Igather", input.nbytes, (self._buf.spec(input), self._buf.spec(flat), root), (input, flat),
                          self._unpack(flat, output_list))

    def gather_single(self, output: torch.Tensor | None, input: torch.Tensor, root: int) -> EngineHandle:
        recv = self._buf.spec(output) if output is not None else None
        return self._coll("Igather", input.nbytes, (self._buf.spec(input), recv, root), (input, output))
