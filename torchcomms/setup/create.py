"""``new_comm``: a communicator's creation (its store, its engine's rendezvous, its failure
monitor, default tracing), every step bounded by the communicator's timeout."""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from torchcomms.setup import bootstrap
from torchcomms.backends.base import BackendContext, TorchCommBackend
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


def new_comm(
    backend: str,
    device: torch.device | str,
    name: str,
    abort_process_on_timeout_or_error: bool | None = None,
    timeout: timedelta | None = None,
    is_high_priority_stream: bool | None = None,
    store: Any = None,
    enable_reconfigure: bool = False,
    hints: dict[str, str] | None = None,
) -> TorchComm:
    """Create a communicator over every rank of the job (rank/size from the environment).

    ``backend`` names a registered engine (``gloo``, ``fake``, ...); ``name`` must be unique in
    the process. See ``API.md`` for the discovery order of rank, size and store.
    """
    if not isinstance(backend, str) or not backend:
        raise CommTypeError(f"backend must be a non-empty str, got {backend!r}")
    if not isinstance(name, str) or not name:
        raise CommValueError(f"name must be a non-empty str, got {name!r}")
    if hints is not None and (
        not isinstance(hints, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in hints.items())
    ):
        raise CommTypeError(f"hints must be a dict[str, str], got {hints!r}")
    if timeout is not None and not isinstance(timeout, timedelta):
        raise CommTypeError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    if timeout is not None and timeout.total_seconds() <= 0:
        raise CommValueError(f"timeout must be positive, got {timeout}")
    cls = get_backend_class(backend)
    dev = bootstrap.resolve_device(device)
    caps = cls.capabilities
    if dev.type not in caps.devices:
        raise CommValueError(
            f"backend {backend!r} runs on {', '.join(caps.devices)} devices, not {dev.type} (comm {name!r})"
        )
    hints = dict(hints or {})
    rank, size, _src = bootstrap.discover_rank_size()
    if "rank" in hints or "size" in hints:  # fake backend / tests may pin their own world
        rank, size = int(hints.get("rank", rank)), int(hints.get("size", size))
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
        if cls.needs_store(size) or (store is None and size > 1 and bootstrap.control_plane_address()):
            try:
                the_store, _kind = bootstrap.resolve_store(store, rank, size, timeout_td, until=deadline)
            except (StoreNotAnswering, dist.DistError) as e:
                raise error_map.store_connect_error(e, store_words, secs, where) from None
            store_words = describe_store(the_store)
        else:
            the_store = store
        prefix = f"torchcomms/{name}/{incarnation}"
        ctx = BackendContext(
            name=name,
            rank=rank,
            size=size,
            device=dev,
            store=the_store,
            store_prefix=prefix,
            timeout=timeout_td,
            hints=hints,
            global_ranks=tuple(range(size)),
        )
        engine = cls(ctx)
        _init_engine(engine, deadline, store_words, secs, where)
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


def _init_engine(engine: TorchCommBackend, deadline: float, store_words: str, secs: float,
                 where: dict[str, Any]) -> None:
    """``engine.init()`` (its rendezvous), waited for until ``deadline``: on a thread of its own
    when it rendezvous through a store, which may stop answering. An engine that is ready only
    after the deadline is aborted, never used. Raises a typed error."""
    if not type(engine).needs_store(engine.ctx.size):
        engine.init()
        return
    try:
        call_until("the engine's rendezvous", engine.init, deadline, thread_name=f"torchcomms-init-{engine.ctx.name}",
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
