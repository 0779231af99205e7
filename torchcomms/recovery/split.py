"""``split``: a new communicator over a subset of the ranks of one."""
from __future__ import annotations

import hashlib
import time
from typing import Any

import torch

from torchcomms.core.c10d_lists import c10d_members_skip_this_device, refuse_lists_c10d_refuses
from torchcomms.core.comm_core import CommCore
from torchcomms.core.dispatch import dispatch
from torchcomms.core.errors import CollectiveMismatchError, CommError
from torchcomms.core.names import NAMES
from torchcomms.core.types import OpName
from torchcomms.core import error_map
from torchcomms.core.store_calls import StoreNotAnswering, call_until
from torchcomms.backends.base import TorchCommBackend
from torchcomms.recovery.engines import build_error, build_until, derived_context
from torchcomms.recovery.shrink import MakeComm


#: a member list's count in the exchange from a rank that refused its own arguments
_REFUSED = -2


def _ranks_key(ranks: list[int]) -> str:
    """A short, stable key of a member list, so that disjoint groups split under the same
    name rendezvous under different store keys."""
    return hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:12]


def _inconsistency(lists: list[list[int]]) -> tuple[tuple[int, list[int]], tuple[int, list[int]]] | None:
    """The first pair of ranks whose lists disagree, from the whole table (``lists[r]`` is what
    rank ``r`` passed): a rank named in a list must have passed that same list."""
    for r, mine in enumerate(lists):
        for m in mine:
            if lists[m] != mine:
                return (r, mine), (m, lists[m])
    return None


def _take_part_excluded(core: CommCore, work: Any) -> None:
    """A rank left out of a split takes part in the engine's side of it (NCCL's split is
    collective over the parent), bounded by the split's deadline."""
    if type(core.backend).split_excluded is TorchCommBackend.split_excluded:
        return  # nothing to take part in
    rec = work.record
    try:
        call_until(f"{core.name!r}'s engine split", core.backend.split_excluded, work.deadline,
                   thread_name=f"torchcomms-split-{core.name}", store=core.ctx.store)
    except StoreNotAnswering:
        raise error_map.engine_not_built("the split's engine", core.global_ranks, core.known_failures(),
                                         core.global_ranks, core.ctx.store, rec.timeout_s,
                                         core.where(rec)) from None
    except BaseException as e:  # noqa: BLE001 - the engine may throw anything
        raise build_error(core, e, rec.timeout_s, str(rec.name), rec.seq or None) from None


def split(core: CommCore, ranks: list[int], name: str, hints: dict[str, str] | None, timeout: Any,
          make_comm: MakeComm) -> Any:
    """See ``TorchComm.split``: the new communicator on members, ``None`` elsewhere.

    Arguments refused on a rank (duplicates, an out-of-range rank, a list without this rank, a bad
    name) are refused on every rank: the refusing rank still takes part in the exchange of
    member lists with a refusal mark, raises its own error after it, and every other rank raises
    ``CollectiveMismatchError`` naming it (else they would wait for it until the timeout). A split
    for ``torch.distributed`` whose member lists torch refuses on some ranks before they get here
    is refused here, before the exchange, and c10d's non-member split of a device type its
    members do not split is skipped (:mod:`torchcomms.core.c10d_lists`)."""
    refuse_lists_c10d_refuses(core.name)
    if not ranks and c10d_members_skip_this_device():
        return None
    c = core.checker
    refused: CommError | None = None
    try:
        members = c.split_ranks(ranks)
        if not isinstance(name, str) or not name:
            raise c.value_error("split", f"name must be a non-empty str, got {name!r}")
        c.hints("split", hints)
    except CommError as e:
        members, refused, hints = [], e, None
    size, rank = core.size, core.rank
    width = size + 1
    mine = torch.full((width,), -1, dtype=torch.int64, device=core.device)
    mine[0] = len(members) if refused is None else _REFUSED
    if members:
        mine[1: 1 + len(members)] = torch.tensor(members, dtype=torch.int64)
    table = torch.empty(size * width, dtype=torch.int64, device=core.device)
    work = dispatch(core, OpName.split, False, hints, timeout, [mine], [table], core.backend.all_gather_single,
                    (table, mine))
    seq = work.record.seq
    rows = table.view(size, width).cpu().tolist()
    if refused is not None:
        raise refused
    refusers = [q for q, row in enumerate(rows) if row[0] == _REFUSED]
    if refusers:
        raise CollectiveMismatchError(
            f"split: rank(s) {refusers} refused their arguments (a ranks list with duplicates, an out-of-range "
            f"rank or without that rank, or a bad name or hints; their error says which)",
            comm=core.name, op="split", seq=seq, ranks=refusers)
    inconsistent = _inconsistency([row[1: 1 + row[0]] for row in rows])
    if inconsistent is not None:  # every rank sees the same table: every rank raises this
        (a, lists_a), (b, lists_b) = inconsistent
        raise CollectiveMismatchError(
            f"split: rank {a} passed ranks {lists_a} but rank {b} passed {lists_b} (each member of a "
            f"group must pass the group's list, and every rank in a list must be a member of it)",
            comm=core.name, op="split", seq=seq, ranks=[a, b],
        )
    if not members:
        _take_part_excluded(core, work)
        return None
    incarnation = NAMES.claim(name)
    try:
        child_ctx = derived_context(
            core, [core.global_ranks[r] for r in members],
            f"{core.ctx.store_prefix}/split{seq}/{name}/{incarnation}/{_ranks_key(members)}",
            max(1.0, work.deadline - time.monotonic()),  # its rendezvous ends with the split
            rank=members.index(rank), name=name, hints=hints)
        # The new engine's rendezvous waits on every member: bounded by this split's own
        # deadline (which its exchange above already counted down), not by the engine's.
        rec = work.record
        try:
            child_backend = build_until(core, child_ctx, work.deadline)
        except BaseException as e:  # noqa: BLE001 - the engine may throw anything
            raise build_error(core, e, rec.timeout_s, str(rec.name), rec.seq or None) from None
        if child_backend is None:
            raise error_map.engine_not_built("the new communicator's engine", child_ctx.global_ranks,
                                             core.known_failures(), core.global_ranks, core.ctx.store,
                                             rec.timeout_s, core.where(rec))
        child_core = CommCore(child_backend, core.derived_options(child_ctx.hints), core.store)
        child = make_comm(child_core)
    except BaseException:
        NAMES.release(name, None)
        raise
    core.adopt(child, child_core)
    return child
