"""The member lists of the ``torch.distributed`` call splitting a communicator on the torchcomms
route (``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1``), read from c10d's frames.

torch's ``split_group`` checks its lists (empty, longer than the world, a rank twice) only up to
the list holding the calling rank, and ``new_group``'s non-members skip the check and split the
communicator as non-members at once. So a list that torch refuses raises ``ValueError`` on some
ranks before any split, and the others would wait in a split that the refusing ranks never join:
:func:`refuse_lists_c10d_refuses` refuses such lists on those other ranks too, before the split.
"""
from __future__ import annotations

import inspect
from typing import Any

from torchcomms.core.errors import CommValueError

_C10D = "torch.distributed.distributed_c10d"
#: c10d's functions that split the default group's communicator, and their local holding the lists
_CALLERS = {"split_group": "split_ranks", "_new_group_via_split_group": "group_ranks"}


def _c10d_caller(max_depth: int) -> tuple[list[list[int]], int] | None:
    """(member lists, world size) of the innermost c10d splitting call among ``max_depth`` callers."""
    frame = inspect.currentframe()
    frame = frame.f_back.f_back if frame is not None and frame.f_back is not None else None  # the caller's caller
    for _ in range(max_depth):
        if frame is None:
            return None
        name = frame.f_code.co_name
        if name in _CALLERS and frame.f_globals.get("__name__") == _C10D:
            local: Any = frame.f_locals
            lists, world = local.get(_CALLERS[name]), local.get("global_world_size")
            if not isinstance(world, int) or not isinstance(lists, (list, tuple)):
                return None
            if name == "_new_group_via_split_group":  # an empty list makes every rank a non-member alike
                return ([list(lists)] if lists else []), world
            return [list(x) for x in lists], world
        frame = frame.f_back
    return None


def _why(lists: list[list[int]], world: int) -> str | None:
    """torch's reason to refuse one of ``lists`` (its ``split_group`` checks), else ``None``."""
    for ranks in lists:
        if not ranks:
            return "a group is empty"
        if len(ranks) > world:
            return f"{ranks} has more ranks than the world's {world}"
        if len(set(ranks)) != len(ranks):
            return f"{ranks} lists a rank twice"
    return None


def refuse_lists_c10d_refuses(comm: str, max_depth: int = 8) -> None:
    """Raises ``CommValueError`` when the c10d call splitting communicator ``comm`` (if one is
    among the caller's ``max_depth`` callers) has member lists torch refuses on some ranks."""
    found = _c10d_caller(max_depth)
    if found is None:
        return
    why = _why(*found)
    if why is not None:
        raise CommValueError(f"cannot split by ranks {found[0]}: {why} (torch refuses it on the ranks that read "
                             f"it, so no rank takes part in the split)", comm=comm, op="split")


def c10d_members_skip_this_device(max_depth: int = 8) -> bool:
    """Whether the caller is ``new_group``'s non-member path (2.13's ``_new_group_via_split_group``,
    among the caller's ``max_depth`` callers) splitting the communicator of a device type that the
    group's members do not split: one the call's ``backend`` leaves out (``new_group(ranks,
    backend="cpu:gloo")`` on a group with cpu and cuda), or any, where torch's ``split_group``
    refuses that ``backend`` on the members before splitting (``backend="nccl"`` on a gloo world:
    a device the world lacks or gives another backend). That path splits one communicator per
    device type of the world, whatever ``backend`` says, so the extra splits waited for members
    that never came until the timeout. Such a split is skipped there, and a rank left out of a
    refused group goes on, as it does on c10d's own backends."""
    frame = inspect.currentframe()
    frame = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
    for _ in range(max_depth):
        if frame is None:
            return False
        if frame.f_code.co_name == "_new_group_via_split_group" and frame.f_globals.get("__name__") == _C10D:
            local: Any = frame.f_locals
            backend, device, c10d = local.get("backend"), local.get("device"), frame.f_globals
            if backend is None or device is None or "_parse_backend_string" not in c10d:
                return False
            import torch

            parse = c10d["_parse_backend_string"]
            try:
                requested = parse(str(backend))
                world = parse(str(c10d["_world"].pg_map[c10d["_get_default_group"]()][0]))
            except ValueError:  # torch's split_group raises it on the members
                return True
            if any(world.get(d) != b for d, b in requested.items()):
                return True
            return torch.device(device).type not in requested
        frame = frame.f_back
    return False
