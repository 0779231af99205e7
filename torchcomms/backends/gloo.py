"""The CPU engine: c10d's ProcessGroupGloo used as a library.

The engine object is created directly over a (prefixed) store; ``init_process_group`` and
torch.distributed's global state are never touched. Ops gloo lacks are composed from ops it
has (AVG = SUM then divide, PREMUL_SUM = scale then SUM, all_gather_v = one broadcast per rank,
the list all-to-all = one packed ``alltoall_base``).
"""
from __future__ import annotations

import ctypes
import logging
import os
import queue
import re
import socket
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from torchcomms.backends import check_mode, exit_release
from torchcomms.backends.base import (BackendCapabilities, BlockingWait, EngineHandle, TorchCommBackend, avg_finish,
                                      premul_in_place)
from torchcomms.backends.gloo_p2p import FramedRecv, FramedSend
from torchcomms.backends.gloo_sockets import EngineSockets
from torchcomms.config import settings
from torchcomms.csrc import gloo_guard
from torchcomms.types import RedOpType, ReduceOp

_C10D_OPS = {
    RedOpType.SUM: dist.ReduceOp.SUM,
    RedOpType.AVG: dist.ReduceOp.SUM,
    RedOpType.PREMUL_SUM: dist.ReduceOp.SUM,
    RedOpType.PRODUCT: dist.ReduceOp.PRODUCT,
    RedOpType.MIN: dist.ReduceOp.MIN,
    RedOpType.MAX: dist.ReduceOp.MAX,
    RedOpType.BAND: dist.ReduceOp.BAND,
    RedOpType.BOR: dist.ReduceOp.BOR,
    RedOpType.BXOR: dist.ReduceOp.BXOR,
}
_GLOO_DTYPES = frozenset(
    {
        torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
        torch.float32, torch.float64, torch.complex64, torch.complex128,
    }
)
_PEER_PATTERNS = ("connection closed", "connection reset", "broken pipe", "connection refused", "pair closure",
                  "socket closed", "eof", "peer")
_TIMEOUT_PATTERNS = ("timed out", "timeout")


#: a rank's published value: its check mode ("c" on, "-" off), then its listener's address
_LISTENER_KEY = "torchcomms/listener/{}"
_CHECK_ON, _CHECK_OFF = "c", "-"
_log = logging.getLogger(__name__)
_DRAIN_LIMIT_S = 5.0  # how long abort() waits for an abandoned engine's failed ops to be delivered
_COMPLETING_LIMIT_S = 1.0  # how long the exit release waits for a future being completed (microseconds, as a rule)


class _Drained:
    """A done-callback whose release (after every earlier callback of the future ran and
    was released) is counted: the future's completion no longer needs the interpreter."""

    def __init__(self, counter: list[int], cond: threading.Condition) -> None:
        self._counter = counter
        self._cond = cond

    def __call__(self, fut: torch.futures.Future) -> None:
        pass

    def __del__(self) -> None:
        with self._cond:
            self._counter[0] -= 1
            self._cond.notify_all()


def _drain_counter(futures: list[torch.futures.Future]) -> Callable[[float], bool]:
    """A wait, at most the seconds it is given, until every one of ``futures`` (not done when
    this is called) ran its callbacks, those added until now included, and released them;
    whether they all did."""
    counter, cond = [len(futures)], threading.Condition()
    for fut in futures:
        fut.add_done_callback(_Drained(counter, cond))

    def wait(limit_s: float) -> bool:
        with cond:
            return cond.wait_for(lambda: counter[0] <= 0, limit_s)
    return wait


class _BlockingWaiter:
    """Daemon threads that turn gloo's future-less p2p works into completed futures."""

    def __init__(self, max_threads: int = 64) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._all_idle = threading.Condition(self._lock)
        self._threads = 0
        self._idle = 0
        self._max = max_threads

    def wait_idle(self, limit_s: float) -> bool:
        """Wait, at most ``limit_s``, until no thread is completing a future; whether none is.

        Completing one releases the interpreter's lock (torch's ``set_result``) and takes it
        again after the future's callbacks ran: a thread still there when the interpreter's
        finalization begins is ended by it inside C++, which aborts the process ("terminate
        called without an active exception"), 3 in 8 exits after a timed-out receive."""
        with self._all_idle:
            return self._all_idle.wait_for(lambda: self._idle >= self._threads, limit_s)

    def future_of(self, work: dist.Work) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        with self._lock:
            spawn = self._idle == 0 and self._threads < self._max
            if spawn:
                self._threads += 1
            else:
                self._idle -= 1
        self._queue.put((work, fut))
        if spawn:
            threading.Thread(target=self._loop, name="torchcomms-gloo-p2p", daemon=True).start()
        return fut

    def close(self) -> None:
        """Let every thread end once the works queued before this are done (each takes one
        ``None``); else each communicator that ever ran a p2p op left its threads behind."""
        with self._lock:
            threads = self._threads
        for _ in range(threads):
            self._queue.put(None)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                with self._all_idle:
                    self._idle -= 1
                    self._threads -= 1
                    self._all_idle.notify_all()
                return
            work, fut = item
            del item  # the tuple would hold the work (and its tensors) past the ``del work`` below
            error: BaseException | None = None
            try:
                work.wait()
            except BaseException as e:  # noqa: BLE001
                error = e
            # the work holds the op's tensors (gloo's reduce-scatter: a copy of its whole
            # input): let go of it before the op is reported done, or whoever the report wakes
            # may run on while this thread still holds them (and while idle, until its next op)
            del work
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)
            del fut, error
            with self._all_idle:
                self._idle += 1
                self._all_idle.notify_all()


class ReceiveOverflow(RuntimeError):
    """This rank received a message longer than the buffer it posted for it: the ranks called
    the op with tensors of different sizes. Gloo's network thread, which met it, is parked by
    the guard (``torchcomms.csrc.gloo_guard``), so the engine is of no further use."""

    def __init__(self, gloo_message: str) -> None:
        sizes = re.search(r"(\d+) vs (\d+)", gloo_message)
        got = (f"a message of {sizes[1]} bytes for a buffer of {sizes[2]}" if sizes
               else "a message longer than its buffer")
        super().__init__(f"this rank received {got}: the ranks passed tensors of different sizes "
                         f"(TORCHCOMM_CHECK_COLLECTIVES=1 names them); gloo: {gloo_message}")


def _engine_wait(work: dist.Work, overflow: Callable[[], ReceiveOverflow | None] | None = None) -> BlockingWait:
    """Wait on a c10d work in the caller's thread, as c10d itself does (GIL released). When a
    slice runs out, ``overflow()`` tells whether the engine met a receive overflow: the op then
    fails with it (it would never end)."""

    def wait(timeout_s: float) -> bool:
        # c10d reads a 0 ms timeout as "no timeout": never pass less than 1 ms
        try:
            work.wait(timedelta(seconds=max(timeout_s, 0.001)))
            return True
        except RuntimeError:
            if not work.is_completed():  # the slice ran out ("Operation timed out!"), the op did not
                error = overflow() if overflow is not None else None
                if error is not None:
                    raise error from None
                return False
        # Ended, maybe just after the slice ran out: ask again (no timeout: returns at once) so
        # that the outcome is the op's own, never the slice's "Operation timed out!".
        work.wait()
        return True

    return wait


def _local_address_towards(host: str) -> str | None:
    """The local IP address the kernel would use to reach ``host`` (no packet is sent)."""
    try:
        infos = socket.getaddrinfo(host, 1, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, _, _, _, addr in infos:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(addr)
                return s.getsockname()[0]
        except OSError:
            continue
    return None


#: gloo's own limit on an op once the engine is built. ``TorchComm`` ends every op at that op's
#: deadline (and breaks, then aborts, the engine), so this only backs it up; it must not be the
#: timeout the engine was built with, which bounds the rendezvous (for a shrink, what was left of
#: it) and can be shorter than an op's own timeout.
ENGINE_OP_BACKSTOP = timedelta(days=1)


class GlooBackend(TorchCommBackend):
    backend_name = "gloo"
    capabilities = BackendCapabilities(devices=("cpu",), abort=False, shrink=True, dtypes=_GLOO_DTYPES,
                                       complex_product=False, recv_any_source=True)
    #: connections :meth:`revoke` shut down (then the engine is only ever abandoned)
    _revoked = 0

    def init(self) -> None:
        ctx = self.ctx
        store = ctx.store if ctx.store is not None else dist.HashStore()
        self._sockets = EngineSockets()
        if ctx.own_store_client and ctx.size > 1:  # a store client of its own: see BackendContext
            store = self._sockets.store_client(store)
        self._store: Any = dist.PrefixStore(ctx.store_prefix + "/gloo", store)
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = ctx.timeout
        threads = ctx.hints.get("gloo.threads")
        if threads:
            opts._threads = int(threads)
        gloo_guard.install()  # a receive overflow then parks gloo's network thread instead of aborting
        opts._devices = [self._sockets.open_device(self._device)]
        self._confirm_p2p = check_mode.enabled(ctx.hints)  # the collective check's mode: p2p is confirmed too
        if ctx.size > 1:
            mode = _CHECK_ON if self._confirm_p2p else _CHECK_OFF
            self._store.set(_LISTENER_KEY.format(ctx.rank), mode + (self._sockets.listener or ""))
        self._pg = dist.ProcessGroupGloo(self._store, ctx.rank, ctx.size, opts)
        # ctx.timeout bounded the rendezvous just done (after a shrink: what was left of it); the
        # communicator ends each op at the op's own deadline, so gloo's own limit is a backstop
        self._pg._set_default_timeout(ENGINE_OP_BACKSTOP)
        self._waiter = _BlockingWaiter()
        if ctx.size > 1:
            published = self._published()
            self._sockets.engine_created([v[1:] for r, v in enumerate(published) if r != ctx.rank and v[1:]])
        self._last_recv: dict[int, FramedRecv] = {}  # per source: receives post in program order
        self._last_send: dict[int, FramedSend] = {}  # per destination (the check mode's sends too)
        # the ops not yet done, by their future's id: the future, and the c10d work that holds
        # the op's tensors; a done one is dropped at once (the future's value holds the op's
        # outputs: an all-gather's whole output buffer)
        self._pending: dict[int, tuple[torch.futures.Future, dist.Work]] = {}
        self._pending_lock = threading.Lock()
        if ctx.size > 1:
            self._refuse_mixed_check([v[:1] == _CHECK_ON for v in published])
        exit_release.watch(self)

    def _published(self) -> list[str]:
        """Every rank's check mode and listener address, as each published them before building
        the engine (all set by now)."""
        keys = [_LISTENER_KEY.format(r) for r in range(self.ctx.size)]
        try:
            values = self._store.multi_get(keys)
        except (AttributeError, NotImplementedError, RuntimeError):
            values = [self._store.get(k) for k in keys]
        return [v.decode() for v in values]

    def _refuse_mixed_check(self, checks: list[bool]) -> None:
        """Raise ``CommValueError`` on every rank when the ranks (``checks``: each one's mode) do
        not all run the collective check (``check_mode``; a check-mode send would also wait for an
        answer its receiver never sends)."""
        error = check_mode.disagreement(checks, self.ctx.name)
        if error is not None:
            self.finalize()
            raise error

    def _device(self) -> dist.ProcessGroupGloo.Device:
        hints = self.ctx.hints
        iface = hints.get("gloo.interface") or os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
        if iface:
            return dist.ProcessGroupGloo.create_device(interface=iface)
        host = hints.get("gloo.hostname")
        if not host:
            peer = os.environ.get("MASTER_ADDR")
            ctrl = settings().control_addr
            if ctrl:
                peer = urlparse(ctrl).hostname or peer
            if peer:
                host = _local_address_towards(peer)
        if host:
            return dist.ProcessGroupGloo.create_device(hostname=host)
        return dist.ProcessGroupGloo.create_default_device()

    def version(self) -> str:
        return f"gloo (torch {torch.__version__})"

    def engine(self) -> dist.ProcessGroupGloo:
        return self._pg

    def finalize(self) -> None:
        """Let go of the engine now: with it, the last framed receive (and check-mode send) per
        peer, which hold it too; else it lived until the interpreter's teardown destroyed it,
        which can abort the process ("terminate called without an active exception"). The p2p
        helper threads end. An engine whose network thread is parked is abandoned instead: its
        destructor would wait for ever for the connection lock that thread holds."""
        if self._revoked or self._receive_overflow() is not None:
            self.abort()
        with self._pending_lock:
            self._last_recv.clear()
            self._last_send.clear()
        self._pg = None  # type: ignore[assignment]
        self._store = None  # with the engine, its own store client (if it has one) is let go of
        self._waiter.close()

    def release_at_exit(self) -> None:
        """Let go of the engine at the interpreter's exit (``exit_release``), or abandon it there
        when an op of it is still pending.

        Gloo's worker thread lets go of an op after reporting it done; left to finalization,
        that aborted 12 of 20 two-rank jobs exiting right after an all_reduce on a dropped
        tensor (CPU oversubscribed). The engine's destructor, run here with the GIL released
        (torch's binding), joins those threads after they let go.

        An op still pending (a broken communicator's, blocked on a peer that has not left) must
        not be waited for, and must not be left pending either: it fails when that peer's
        connection ends, which may be after this process's finalization began, and its failure
        then reaches a finalized interpreter (SIGABRT with ``gloo::IoException``, or SIGSEGV:
        5 of 5 two-rank jobs on torch 2.11 with the CPU oversubscribed). So such an engine is
        aborted here, while the interpreter is whole: its connections shut down, its pending
        ops failed and delivered, the engine itself never destroyed."""
        waiter: _BlockingWaiter | None = getattr(self, "_waiter", None)
        pg = getattr(self, "_pg", None)
        if pg is None or any(p is pg for p in _ABANDONED):
            if waiter is not None:
                waiter.wait_idle(_COMPLETING_LIMIT_S)
            return
        if self._revoked or self._undelivered() or self._receive_overflow() is not None:  # see finalize()
            self.abort()
            return
        if waiter is not None:
            waiter.wait_idle(_COMPLETING_LIMIT_S)
        with self._pending_lock:
            self._last_recv.clear()  # framed p2p ops hold the engine too
            self._last_send.clear()
        self._pg = None  # type: ignore[assignment]

    def revoke(self) -> None:
        """Shut the engine's connections down, without waiting for anything: a peer failure
        broke the communicator, and a survivor blocked on this rank (gloo fails only the ops of
        the connection that broke) then fails at once with a lost connection instead of at its
        deadline. The engine is abandoned later by :meth:`abort` (or ``finalize``), which
        delivers the ops this failed."""
        sockets: EngineSockets | None = getattr(self, "_sockets", None)
        pg = getattr(self, "_pg", None)
        if sockets is None or pg is None or any(p is pg for p in _ABANDONED):
            return
        self._revoked += sockets.shut_down()

    def abort(self) -> None:
        """Abandon the engine: its pending ops fail now, and it is never destroyed.

        Gloo cannot cancel work, so the engine's connections are shut down: every op still
        pending on it (one blocked on a stopped peer, say) fails at once, and its callbacks
        run before this returns, while the interpreter can run them (see
        :class:`EngineSockets`). The engine itself stays referenced forever: its destructor
        joins threads that may still be blocked."""
        pg = getattr(self, "_pg", None)
        if pg is not None and not any(p is pg for p in _ABANDONED):
            sockets: EngineSockets | None = getattr(self, "_sockets", None)
            pending = self._undelivered()  # their c10d works hold their tensors: kept for ever, below
            held = [work for _, work in pending]
            # a parked network thread delivers nothing more and holds a connection's lock, which
            # c10d's shutdown may wait for: only the connections are shut down then
            parked = sockets is not None and self._receive_overflow() is not None
            try:
                # counted before the shutdown: gloo's thread may fail an op and start its
                # callbacks before this thread looks again, and a done future's callbacks
                # cannot be waited for from outside
                drained = _drain_counter([fut for fut, _ in pending])
                recorded = (len(sockets.fds) if sockets is not None else 0) + self._revoked
                shut = (sockets.shut_down() if sockets is not None else 0) + self._revoked  # revoked: shut already
                if shut and not parked:
                    if not (drained(_DRAIN_LIMIT_S) and self._waiter.wait_idle(_DRAIN_LIMIT_S)):
                        _log.warning("abandoned gloo engine %s: its pending ops were not all delivered within "
                                     "%.0f s of shutting its %d connections down", self.ctx.name, _DRAIN_LIMIT_S,
                                     recorded)
                elif recorded == 0 and self._undelivered() and not parked:
                    _log.warning("abandoned gloo engine %s: none of its connections was found (/proc), so its "
                                 "pending ops fail only when their peers' connections end", self.ctx.name)
            except Exception:  # noqa: BLE001 - abort never raises
                pass
            try:
                self._waiter.close()  # its threads end as their ops fail (the connections are shut)
            except Exception:  # noqa: BLE001 - abort never raises
                pass
            _ABANDONED.append(pg)
            # Gloo's worker drops a failed op's work after delivering it: the last reference to
            # a tensor the program dropped would then be released on that thread, which needs
            # the interpreter for the tensor's Python object, maybe once finalization began
            # (at the exit, right after ``release_at_exit`` aborted this engine): never let go.
            _ABANDONED.extend(held)
            for kept in (pg, *held):
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(kept))  # outlives module teardown
            try:
                if not parked:
                    pg.shutdown()
            except Exception:  # noqa: BLE001 - best effort; abort never raises
                pass

    def _undelivered(self) -> list[tuple[torch.futures.Future, dist.Work]]:
        """The ops not done yet: each one's future and c10d work."""
        with self._pending_lock:
            return [(fut, work) for fut, work in self._pending.values() if not fut.done()]

    def classify_error(self, error: BaseException) -> str:
        if isinstance(error, ReceiveOverflow):
            return "mismatch"
        msg = str(error).lower()
        if any(p in msg for p in _TIMEOUT_PATTERNS):
            return "timeout"
        if any(p in msg for p in _PEER_PATTERNS):
            return "peer"
        return "other"

    # helpers ---------------------------------------------------------------------------------
    def _handle(self, works: list[dist.Work], finish: Callable[[], None] | None = None) -> EngineHandle:
        return EngineHandle.waitable([_engine_wait(w, self._receive_overflow) for w in works],
                                     lambda: [self._future(w) for w in works], finish)

    def _receive_overflow(self) -> ReceiveOverflow | None:
        """The receive overflow that parked this engine's network thread, if one did."""
        message = gloo_guard.parked_message(self._sockets.loop_threads)
        return None if message is None else ReceiveOverflow(message)

    def _refuse_when_parked(self) -> None:
        """Raise the receive overflow that parked this engine's network thread: a point-to-point
        op posts on the caller's thread, which would wait for ever for the connection's lock."""
        error = self._receive_overflow()
        if error is not None:
            raise error

    def _future(self, work: dist.Work) -> torch.futures.Future:
        """The work's future; gloo works without one are waited on by a helper thread."""
        try:
            return self._tracked(work.get_future(), work)
        except RuntimeError:
            return self._p2p_future(work)

    def _p2p_future(self, work: dist.Work) -> torch.futures.Future:
        return self._tracked(self._waiter.future_of(work), work)

    def _tracked(self, fut: torch.futures.Future, work: dist.Work) -> torch.futures.Future:
        """Remember ``fut`` (and ``work``, which holds the op's tensors) until it is done, so
        that :meth:`abort` can wait for its delivery; forgotten by its first callback (keeping a
        done future would keep its value, the op's outputs, alive until the communicator's next
        op)."""
        key = id(fut)
        with self._pending_lock:
            self._pending[key] = (fut, work)
        fut.add_done_callback(lambda _: self._forget(key))
        return fut

    def _forget(self, key: int) -> None:
        with self._pending_lock:
            self._pending.pop(key, None)

    def _avg_finish(self, t: torch.Tensor, op: ReduceOp) -> Callable[[], None] | None:
        return avg_finish(t, op, self.ctx.size)

    # point to point (framed: see gloo_p2p) ---------------------------------------------------
    def _framed_recv(self, tensor: torch.Tensor, src: int, tag: int) -> FramedRecv:
        self._refuse_when_parked()
        with self._pending_lock:
            last = self._last_recv.get(src)
            op = FramedRecv(self._pg, tensor, src, tag, self.ctx.rank, [last] if last else [], self._confirm_p2p)
            self._last_recv[src] = op
        return op

    def recv_any_source(self, tensor: torch.Tensor, tag: int, found: Callable[[int], None]) -> EngineHandle:
        """A receive from any peer: it posts its header after every receive issued before it
        posted its payload buffer, and every receive issued after it waits likewise for it (so
        no two header receives that one message could match are ever posted together)."""
        self._refuse_when_parked()
        with self._pending_lock:
            op = FramedRecv(self._pg, tensor, None, tag, self.ctx.rank, list(set(self._last_recv.values())),
                            self._confirm_p2p, found)
            for peer in range(self.ctx.size):
                if peer != self.ctx.rank:
                    self._last_recv[peer] = op
        return EngineHandle([self._p2p_future(op)])

    def _framed_send(self, tensor: torch.Tensor, dst: int, tag: int) -> FramedSend:
        self._refuse_when_parked()
        with self._pending_lock:
            op = FramedSend(self._pg, tensor, dst, tag, self.ctx.rank, self._confirm_p2p, self._last_send.get(dst))
            if self._confirm_p2p:
                self._last_send[dst] = op
        return op

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> EngineHandle:
        return EngineHandle([self._p2p_future(self._framed_send(tensor, dst, tag))])

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> EngineHandle:
        return EngineHandle([self._p2p_future(self._framed_recv(tensor, src, tag))])

    def batch_p2p(self, ops: list[tuple[bool, torch.Tensor, int]], tag: int) -> EngineHandle:
        futs = []
        for is_send, t, peer in ops:
            op = self._framed_send(t, peer, tag) if is_send else self._framed_recv(t, peer, tag)
            futs.append(self._p2p_future(op))
        return EngineHandle(futs)

    # collectives -----------------------------------------------------------------------------
    # Ops that move data without reducing it send a complex tensor's real view: c10d's gloo
    # refuses complex tensors in its gathers and all-to-alls ("Invalid scalar type").
    def broadcast(self, tensor: torch.Tensor, root: int) -> EngineHandle:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        return self._handle([self._pg.broadcast([_real(tensor)], opts)])

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> EngineHandle:
        premul_in_place(tensor, op)
        opts = dist.AllreduceOptions()
        opts.reduceOp = _C10D_OPS[op.type]
        return self._handle([self._pg.allreduce([tensor], opts)], self._avg_finish(tensor, op))

    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp) -> EngineHandle:
        premul_in_place(tensor, op)
        opts = dist.ReduceOptions()
        opts.reduceOp = _C10D_OPS[op.type]
        opts.rootRank = root
        finish = self._avg_finish(tensor, op) if self.ctx.rank == root else None
        return self._handle([self._pg.reduce([tensor], opts)], finish)

    def all_gather(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor) -> EngineHandle:
        return self._handle([self._pg.allgather([[_real(t) for t in tensor_list]], [_real(tensor)])])

    def all_gather_v(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor) -> EngineHandle:
        tensor_list[self.ctx.rank].copy_(tensor)
        works = []
        for r, t in enumerate(tensor_list):
            opts = dist.BroadcastOptions()
            opts.rootRank = r
            works.append(self._pg.broadcast([_real(t)], opts))
        return self._handle(works)

    # The flat ops (``*_single``) take any shapes of the right element counts; c10d's gloo compares
    # dim 0 (a 0-dim output made its reduce-scatter crash the process), so they get flat views.
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor) -> EngineHandle:
        return self._handle([self._pg._allgather_base(_real(output.view(-1)), _real(input.view(-1)))])

    # The reduce-scatters are what c10d's gloo makes of them (one all-reduce of the whole input, then
    # this rank's piece) but through the all-reduce's own work: c10d's reduce-scatter work ignores
    # the timeout of a timed wait (it waits for its inner all-reduce without one), so a caller whose
    # peer never came blocked past its deadline.
    def reduce_scatter(self, output: torch.Tensor, input_list: list[torch.Tensor], op: ReduceOp) -> EngineHandle:
        with torch.no_grad():
            packed = torch.cat([t.reshape(-1) for t in input_list])
        start = sum(t.numel() for t in input_list[:self.ctx.rank])
        return self._reduced_piece(packed, start, output, op)

    reduce_scatter_v = reduce_scatter

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, op: ReduceOp) -> EngineHandle:
        with torch.no_grad():
            packed = input.reshape(-1).clone()
        return self._reduced_piece(packed, self.ctx.rank * output.numel(), output, op)

    def _reduced_piece(self, packed: torch.Tensor, start: int, output: torch.Tensor, op: ReduceOp) -> EngineHandle:
        """All-reduce ``packed`` (a copy of the whole input), then copy its elements from ``start``
        on into ``output``."""
        premul_in_place(packed, op)
        opts = dist.AllreduceOptions()
        opts.reduceOp = _C10D_OPS[op.type]
        avg = self._avg_finish(output, op)

        def finish() -> None:
            with torch.no_grad():
                output.view(-1).copy_(packed[start:start + output.numel()])
            if avg is not None:
                avg()

        return self._handle([self._pg.allreduce([packed], opts)], finish)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor) -> EngineHandle:
        return self._handle([self._pg.alltoall_base(_real(output), _real(input), [], [], dist.AllToAllOptions())])

    def all_to_all_v_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                            input_split_sizes: list[int]) -> EngineHandle:
        return self._handle(
            [self._pg.alltoall_base(_real(output), _real(input), output_split_sizes, input_split_sizes,
                                    dist.AllToAllOptions())]
        )

    def all_to_all(self, output_list: list[torch.Tensor], input_list: list[torch.Tensor]) -> EngineHandle:
        """Through ``alltoall_base`` on packed buffers: gloo's list form (``alltoall``) is missing
        from torch 2.11 ("Backend gloo does not support alltoall"). Each peer's piece may have
        its own size; the outputs are filled when the op finishes."""
        send = torch.cat([t.reshape(-1) for t in input_list]) if input_list else torch.empty(0)
        recv = torch.empty(sum(t.numel() for t in output_list), dtype=send.dtype)
        out_splits = [t.numel() for t in output_list]

        def unpack() -> None:
            for t, piece in zip(output_list, recv.split(out_splits)):
                t.copy_(piece.view(t.shape))

        work = self._pg.alltoall_base(_real(recv), _real(send), out_splits, [t.numel() for t in input_list],
                                      dist.AllToAllOptions())
        return self._handle([work], unpack)

    def barrier(self) -> EngineHandle:
        return self._handle([self._pg.barrier(dist.BarrierOptions())])

    def scatter(self, output: torch.Tensor, input_list: list[torch.Tensor] | None, root: int) -> EngineHandle:
        opts = dist.ScatterOptions()
        opts.rootRank = root
        ins = [[_real(t) for t in input_list]] if input_list is not None else []
        return self._handle([self._pg.scatter([_real(output)], ins, opts)])

    def gather(self, output_list: list[torch.Tensor] | None, input: torch.Tensor, root: int) -> EngineHandle:
        opts = dist.GatherOptions()
        opts.rootRank = root
        outs = [[_real(t) for t in output_list]] if output_list is not None else []
        return self._handle([self._pg.gather(outs, [_real(input)], opts)])



def _real(t: torch.Tensor) -> torch.Tensor:
    """``t``, or its real view (a last dimension of 2) when it is complex."""
    return torch.view_as_real(t) if t.is_complex() else t


# Engines of broken communicators, and the c10d works of their ops still pending then: kept
# referenced so the engines' destructors (which join threads possibly blocked on a dead peer)
# never run on a user's thread, and the works' tensors are never released on gloo's.
_ABANDONED: list[object] = []
