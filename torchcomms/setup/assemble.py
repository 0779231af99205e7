"""A communicator's creation behind :func:`torchcomms.setup.create.new_comm` (its store, its
engine's rendezvous, its failure monitor, default tracing), every step bounded by the
communicator's timeout."""
from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from torchcomms.setup import bootstrap
from torchcomms.backends.base import HIGH_PRIORITY_STREAM_HINT, BackendContext, TorchCommBackend
from torchcomms.backends.registry import get_backend_class
from torchcomms.config import settings
from torchcomms.core import error_map
from torchcomms.core.comm import TorchComm
from torchcomms.core.comm_core import CommCore
from torchcomms.core.errors import CommError, CommTypeError, CommValueError
from torchcomms.core.names import NAMES
from torchcomms.core.store_calls import StoreNotAnswering, call_until, describe_store
from torchcomms.core.types import CommOptions
from torchcomms.recovery.failure_monitor import MONITORS
from torchcomms.recovery.store_watch import WATCHES


def assemble_comm(
    backend: str,
    device: torch.device | str,
    name: str,
    abort_process_on_timeout_or_error: bool | None,
    timeout: timedelta | None,
    is_high_priority_stream: bool | None,
    store: Any,
    enable_reconfigure: bool,
    hints: dict[str, str] | None,
) -> TorchComm:
    """The communicator ``new_comm`` describes, its arguments already checked there."""
    cls = get_backend_class(backend)
    dev = bootstrap.resolve_device(device)
    caps = cls.capabilities
    if dev.type not in caps.devices:
        raise CommValueError(
            f"backend {backend!r} runs on {', '.join(caps.devices)} devices, not {dev.type} (comm {name!r})"
        )
    hints = dict(hints or {})
    if is_high_priority_stream:  # the engine reads it as a hint (a hint given explicitly wins)
        hints.setdefault(HIGH_PRIORITY_STREAM_HINT, "true")
    rank, size, rank_source = bootstrap.discover_rank_size()
    global_ranks = None
    helper = bootstrap.c10d_helper_call() if store is not None else None  # made by torch.distributed
    if "rank" in hints or "size" in hints:  # fake backend / tests may pin their own world
        rank, size = int(hints.get("rank", rank)), int(hints.get("size", size))
        rank_source = "hint 'rank'" if "rank" in hints else rank_source
    elif helper is not None:
        name = bootstrap.c10d_device_comm_name(helper, name, dev)
        if bootstrap.c10d_unranked_default_group(helper):
            raise CommValueError(
                f"torch.distributed.init_process_group({backend!r}) on the torchcomms route makes c10d's default "
                "group with rank -1 and size -1 (c10d's path for its own MPI backend), so get_rank() would be -1 "
                "and every new_group would leave this rank out. Use init_process_group('cpu:mpi', rank=..., "
                "world_size=...) (from OMPI_COMM_WORLD_RANK/_SIZE, with a store at MASTER_ADDR/MASTER_PORT or an "
                "init_method), or torchcomms.new_comm('mpi', ...)", comm=name, op="new_comm")
        group = bootstrap.c10d_group_being_made(helper)
        if group is not None:  # c10d's rank and size for the group (a subgroup: its own ranks, not the job's)
            rank, size, global_ranks = group
            if len(set(global_ranks)) != size:  # torch 2.11's new_group does not refuse it (2.13's does)
                raise CommValueError(
                    f"cannot make a group of ranks {list(global_ranks)}: it lists a rank twice, so its members "
                    "would wait in its rendezvous for a member that never comes", comm=name, op="new_comm")
    if timeout is None and helper is not None:  # init_process_group(timeout=...) on the route
        timeout = bootstrap.c10d_group_timeout(helper)
    deferred = _deferred(hints, enable_reconfigure, name)
    cfg = settings()
    timeout_td = timeout if timeout is not None else timedelta(seconds=cfg.timeout_s)
    options = CommOptions(
        abort_process_on_timeout_or_error=(
            abort_process_on_timeout_or_error
            if abort_process_on_timeout_or_error is not None
            else cfg.abort_on_error
        ),
        timeout=timeout_td,
        high_priority_stream=bool(is_high_priority_stream),
        store=store,
        hints=hints,
        enable_reconfigure=enable_reconfigure,
    )
    secs = timeout_td.total_seconds()
    deadline = time.monotonic() + secs  # bounds every store call below, whatever the store's own timeout
    where: dict[str, Any] = dict(comm=name, op="new_comm")
    incarnation = NAMES.claim(name)
    try:
        store_words = describe_store(store) if store is not None else bootstrap.describe_default_store()
        # an engine that needs no store (MPI) still uses the launcher's control plane: its failure
        # events, and the store agree() falls back to
        if (cls.needs_store(size) or deferred
                or (store is None and size > 1 and bootstrap.control_plane_address())):
            try:
                the_store, _kind = bootstrap.resolve_store(store, rank, size, timeout_td, until=deadline)
            except (StoreNotAnswering, dist.DistError) as e:
                raise error_map.store_connect_error(e, store_words, secs, where) from None
            store_words = describe_store(the_store)
        else:
            the_store = store
        options.store = the_store  # the store it met on, found or given (get_options().store)
        prefix = f"torchcomms/{name}/{incarnation}"
        ctx = BackendContext(
            name=name,
            rank=0 if deferred else rank,
            size=1 if deferred else size,
            device=dev,
            store=the_store,
            store_prefix=prefix,
            timeout=timeout_td,
            hints=hints,
            global_ranks=(rank,) if deferred else (global_ranks or tuple(range(size))),
        )
        engine = cls(ctx)
        claim = None if deferred or helper is not None else (lambda: _claim_rank(ctx, rank_source, store_words))
        _init_engine(engine, deadline, store_words, secs, where, claim)
        monitor = None
        if size > 1:
            try:
                monitor = MONITORS.for_store(the_store, rank, until=deadline)
            except Exception as e:  # noqa: BLE001 - the control plane may raise anything
                engine.abort()
                raise error_map.monitor_start_error(e, store_words, secs, deadline, where) from None
            if monitor is None and settings().store_watch:
                # no control plane: failures are found and published through the store
                monitor = WATCHES.for_store(the_store, rank, size)
        core = CommCore(engine, options, the_store)
        comm = TorchComm.from_core(core)
    except BaseException:
        NAMES.release(name, None)  # type: ignore[arg-type]
        raise
    if monitor is not None:
        monitor.watch(core)
    _attach_default_observers(comm)
    return comm


def _deferred(hints: dict[str, str], enable_reconfigure: bool, name: str) -> bool:
    """Whether the hint ``deferred_init="true"`` asks for a communicator of this rank alone,
    formed with the others later by ``reconfigure`` (it needs ``enable_reconfigure=True``)."""
    value = hints.get("deferred_init", "false")
    if value not in ("true", "false"):
        raise CommValueError(f"hint deferred_init must be 'true' or 'false', got {value!r} (comm {name!r})")
    if value == "true" and not enable_reconfigure:
        raise CommValueError(f"hint deferred_init='true' needs enable_reconfigure=True (comm {name!r})")
    return value == "true"


def job_store(timeout: timedelta | None = None) -> Any:
    """The job's key-value store, as ``new_comm`` finds it without ``store=``: the control
    plane's under ``torchcomms-run`` (it outlives every worker), else the TCPStore at
    MASTER_ADDR:MASTER_PORT (hosted by rank 0: it ends with rank 0's process)."""
    if timeout is not None and not isinstance(timeout, timedelta):
        raise CommTypeError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    rank, size, _src = bootstrap.discover_rank_size()
    td = timeout if timeout is not None else timedelta(seconds=settings().timeout_s)
    try:
        return bootstrap.resolve_store(None, rank, max(size, 2), td)[0]
    except (StoreNotAnswering, dist.DistError) as e:
        raise error_map.store_connect_error(e, bootstrap.describe_default_store(), td.total_seconds(),
                                            dict(comm=None, op="job_store")) from None


def _claim_rank(ctx: BackendContext, rank_source: str, store_words: str) -> None:
    """Claim this rank's place in the communicator's rendezvous: the first process to claim a rank
    in the store gets it; a second one (two processes given the same rank, or another job meeting
    on the same store under the same name) is refused at once with ``CommValueError`` instead of
    both waiting for peers until the timeout."""
    claims = int(ctx.store.add(f"{ctx.store_prefix}/claims/{ctx.rank}", 1))
    if claims > 1:
        raise CommValueError(
            f"rank {ctx.rank} of {ctx.size} is already claimed by another process in {store_words} "
            f"({claims} claims; this one's rank came from {rank_source}): every process of a job "
            "needs a rank of its own, and jobs that share a store need communicator names of their own (a job "
            "restarted on the store of its last run: a fresh store, or a dist.PrefixStore per attempt)",
            comm=ctx.name, op="new_comm")


def _init_engine(engine: TorchCommBackend, deadline: float, store_words: str, secs: float,
                 where: dict[str, Any], claim: Callable[[], None] | None = None) -> None:
    """``engine.init()`` (its rendezvous), waited for until ``deadline``: on a thread of its own
    when it rendezvous through a store, which may stop answering, after ``claim()`` when given.
    An engine that is ready only after the deadline is aborted, never used. Raises a typed error."""
    if not type(engine).needs_store(engine.ctx.size):
        try:
            engine.init()  # bounded by the engine itself (MPI: its nonblocking calls, polled until the timeout)
        except Exception as e:  # noqa: BLE001 - the engine may throw anything
            kind = "" if isinstance(e, CommError) else engine.classify_error(e)
            raise error_map.engine_start_error(e, kind, store_words, secs, where) from None
        return

    def init() -> None:
        if claim is not None:
            claim()
        engine.init()

    try:
        call_until("the engine's rendezvous", init, deadline, thread_name=f"torchcomms-init-{engine.ctx.name}",
                   on_late=lambda _none: engine.abort(), store=engine.ctx.store,
                   limit_s=engine.ctx.timeout.total_seconds())
    except StoreNotAnswering:
        raise error_map.engine_not_ready(store_words, secs, where) from None
    except Exception as e:  # noqa: BLE001 - the engine may throw anything
        kind = "" if isinstance(e, CommError) else engine.classify_error(e)
        raise error_map.engine_start_error(e, kind, store_words, secs, where) from None


def _attach_default_observers(comm: TorchComm) -> None:
    """Default-on tracing (flight recorder, logs, spans) when the tracing package is present."""
    if settings().tracing_disable:
        return
    try:
        from torchcomms.tracing import attach_default_tracing
    except ImportError:
        return
    attach_default_tracing(comm)
