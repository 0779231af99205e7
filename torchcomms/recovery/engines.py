"""Engines of communicators derived from one (split, shrink, reconfigure, the collective
check): the one factory of their ``BackendContext`` and their bounded build."""
from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta

from torchcomms.backends.base import BackendContext, TorchCommBackend
from torchcomms.backends.check_mode import enabled
from torchcomms.core import error_map
from torchcomms.core.comm_core import CommCore
from torchcomms.core.errors import CommError
from torchcomms.core.store_calls import StoreNotAnswering, call_until
from torchcomms.recovery.collective_check import SignatureCheck


def derived_context(core: CommCore, members: Sequence[int], store_prefix: str, timeout_s: float, *,
                    rank: int | None = None, name: str | None = None,
                    hints: dict[str, str] | None = None, own_store_client: bool = False) -> BackendContext:
    """The context of an engine over ``members`` (global ranks, in their new order), derived
    from ``core``'s: same device and store, its own rendezvous prefix. ``rank`` defaults to this
    rank's index in ``members``; ``hints`` are added to the communicator's; ``own_store_client``:
    see ``BackendContext``."""
    if rank is None:
        rank = list(members).index(core.global_ranks[core.rank])
    return BackendContext(
        name=name or core.name, rank=rank, size=len(members), device=core.device, store=core.ctx.store,
        store_prefix=store_prefix, timeout=timedelta(seconds=timeout_s), hints={**core.hints, **(hints or {})},
        global_ranks=tuple(members), own_store_client=own_store_client,
    )


def build_until(core: CommCore, ctx: BackendContext, deadline: float) -> TorchCommBackend | None:
    """``core.backend.split(ctx)`` on a thread, waited for until ``deadline`` or until one of
    its members (``ctx.global_ranks``) is reported failed: then ``None`` (the build goes on
    until ``ctx.timeout`` ends its rendezvous, which waits on every member and on the store,
    or for as long as a stopped store host does not answer; an engine it still makes is
    aborted, never used). Raises the build's error."""
    members = set(ctx.global_ranks)
    backend = core.backend
    try:
        return call_until(f"the rendezvous of {ctx.name!r}'s engine", lambda: backend.split(ctx), deadline,
                          thread_name=f"torchcomms-build-{ctx.name}",
                          give_up=lambda: bool(core.known_failures().keys() & members),
                          on_late=lambda built: built.abort(), store=ctx.store,
                          limit_s=ctx.timeout.total_seconds())
    except StoreNotAnswering:
        return None  # e.g. its rendezvous waits on a dead or stalled rank, or a stopped store


def build_error(core: CommCore, error: BaseException, timeout_s: float, op: str, seq: int | None) -> CommError:
    """The typed error of a build of ``core``'s engine family that raised ``error``."""
    kind = "" if isinstance(error, CommError) else core.backend.classify_error(error)
    return error_map.build_error(error, core.ctx.store, timeout_s, dict(comm=core.name, op=op, seq=seq),
                                 kind, core.global_ranks, core.monitor)


def signature_check(core: CommCore) -> SignatureCheck | None:
    """The collective check of ``core`` when its hints or the environment turn it on: a side
    engine over the same members, made on first use."""
    if core.size <= 1 or not enabled(core.hints):
        return None

    def make_engine(deadline: float) -> TorchCommBackend | None:
        core.check_engines += 1  # every rank makes them at the same ops: the prefixes agree
        ctx = derived_context(core, core.global_ranks, f"{core.ctx.store_prefix}/check{core.check_engines}",
                              max(0.001, deadline - time.monotonic()), rank=core.rank,
                              name=f"{core.name}/check")
        return build_until(core, ctx, deadline)

    return SignatureCheck(make_engine, core.size)
