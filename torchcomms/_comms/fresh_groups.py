"""``new_group(ranks, backend=...)`` on the route (torch 2.13) with a backend that no device of
the world uses: a fresh group of that backend, as c10d makes it.

On the route, 2.13's ``new_group`` delegates to ``_new_group_via_split_group`` / ``split_group``,
which can only split the world's communicators: ``new_group(ranks, backend="gloo")`` on a world
made by ``init_process_group("nccl")`` (Megatron's gloo groups for CPU work beside an nccl world)
raised ``ValueError`` ("Backend mismatch for device 'cuda' ...") on every member, where c10d makes
a gloo group over the store. :func:`install` sends such a call to c10d's own path instead
(``_new_group_with_tag``, as ``new_group`` off the route): its process-group helper makes a new
communicator of that backend over the world's store on the members, and the ranks left out
return ``GroupMember.NON_GROUP_MEMBER`` after the same checks, with no collective.
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

from torchcomms.core.c10d_lists import backend_devices, serves

_MARK = "_torchcomms_fresh_groups"


def world_serves(c10d: Any, backend: Any) -> bool:
    """Whether ``split_group`` can make a group of ``backend`` from the default group
    (``c10d_lists.serves``). ``None`` (the world's backend) is served; so is a name the parser
    refuses, for ``split_group`` to refuse it as it does."""
    if backend is None:
        return True
    try:
        return serves(*backend_devices(vars(c10d), backend))
    except ValueError:
        return True


def _fresh_unless_served(split: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(split)

    def new_group_via_split_group(*args: Any, **kwargs: Any) -> Any:
        from torch.distributed import distributed_c10d as c10d

        given = signature.bind(*args, **kwargs).arguments
        if world_serves(c10d, given.get("backend")):
            return split(*args, **kwargs)
        return c10d._new_group_with_tag(
            given.get("ranks"), given.get("timeout"), given.get("backend"), given.get("pg_options"), None,
            use_local_synchronization=given.get("use_local_synchronization", False),
            group_desc=given.get("group_desc"), device_id=given.get("device_id"),
            sort_ranks=given.get("sort_ranks", True))

    setattr(new_group_via_split_group, _MARK, True)
    return new_group_via_split_group


def install() -> None:
    """Wraps c10d's ``_new_group_via_split_group`` (torch 2.13, looked up by ``new_group`` at call
    time; absent in 2.11, whose ``new_group`` does not split) as above, once per process."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    split = getattr(c10d, "_new_group_via_split_group", None)
    if split is not None and not getattr(split, _MARK, False):
        c10d._new_group_via_split_group = _fresh_unless_served(split)  # type: ignore[union-attr]
