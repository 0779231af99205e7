"""The arguments of the ``torch.distributed`` call splitting a communicator on the torchcomms
route (``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1``), read from c10d's frames.

torch's ``split_group`` checks its lists (empty, longer than the world, a rank twice) only up to
the list holding the calling rank, and ``new_group``'s non-members skip every check and split the
communicator as non-members at once, one split per device type of the world. So an argument that
torch refuses raises on some ranks before any split, and the others would wait in a split that
the refusing ranks never join, until the timeout (which breaks the communicator):
:func:`refuse_lists_c10d_refuses` refuses such lists and timeouts on those other ranks too,
before the split, and :func:`c10d_members_skip_this_device` tells ``new_group``'s non-members
which of their splits no member takes part in.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from datetime import timedelta
from types import FrameType
from typing import Any

from torchcomms.core.errors import CommTypeError, CommValueError

_C10D = "torch.distributed.distributed_c10d"
#: c10d's functions that split the default group's communicator, and their local holding the lists
_CALLERS = {"split_group": "split_ranks", "_new_group_via_split_group": "group_ranks"}


def c10d_frame(names: tuple[str, ...], max_depth: int) -> FrameType | None:
    """The innermost frame of one of c10d's functions ``names`` among the ``max_depth`` frames
    from the caller's caller up."""
    frame = inspect.currentframe()
    for _ in range(2):  # from this function to its caller's caller
        frame = frame.f_back if frame is not None else None
    for _ in range(max_depth):
        if frame is None:
            return None
        if frame.f_code.co_name in names and frame.f_globals.get("__name__") == _C10D:
            return frame
        frame = frame.f_back
    return None


def _lists(frame: FrameType) -> tuple[list[list[int]], int] | None:
    """(member lists, world size) of c10d's splitting call ``frame``."""
    local: Any = frame.f_locals
    name = frame.f_code.co_name
    lists, world = local.get(_CALLERS[name]), local.get("global_world_size")
    if not isinstance(world, int) or not isinstance(lists, (list, tuple)):
        return None
    if name == "_new_group_via_split_group":  # an empty list makes every rank a non-member alike
        return ([list(lists)] if lists else []), world
    return [list(x) for x in lists], world


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
    among the caller's ``max_depth`` callers) has member lists torch refuses on some ranks, and
    ``CommTypeError`` for a ``new_group`` timeout that is not a ``timedelta`` (torch's
    ``TypeError`` on the members)."""
    frame = c10d_frame(tuple(_CALLERS), max_depth)
    found = None if frame is None else _lists(frame)
    if found is None:
        return
    why = _why(*found)
    if why is not None:
        raise CommValueError(f"cannot split by ranks {found[0]}: {why} (torch refuses it on the ranks that read "
                             f"it, so no rank takes part in the split)", comm=comm, op="split")
    timeout = frame.f_locals.get("timeout") if frame.f_code.co_name == "_new_group_via_split_group" else None
    if timeout is not None and not isinstance(timeout, timedelta):
        raise CommTypeError(f"Expected timeout argument to be of type datetime.timedelta, got {timeout!r} (torch "
                            f"refuses it on the group's members, so no rank takes part in the split)",
                            comm=comm, op="split")


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
    frame = c10d_frame(("_new_group_via_split_group",), max_depth)
    if frame is None:
        return False
    backend, device = frame.f_locals.get("backend"), frame.f_locals.get("device")
    if backend is None or device is None or "_parse_backend_string" not in frame.f_globals:
        return False
    import torch

    try:
        requested, world = backend_devices(frame.f_globals, backend)
    except ValueError:  # torch's split_group raises it on the members
        return True
    return not serves(requested, world) or torch.device(device).type not in requested


def backend_devices(c10d: Mapping[str, Any], backend: Any) -> tuple[dict[str, str], dict[str, str]]:
    """(device type -> backend) of ``backend`` and of the default group, read by c10d's
    ``_parse_backend_string`` as its ``split_group`` reads them (on the route,
    ``torchcomms._comms.backend_names``' reading); ``ValueError`` where it refuses one. ``c10d``:
    the names of ``torch.distributed.distributed_c10d`` (its ``vars()``, a frame's globals)."""
    parse = c10d["_parse_backend_string"]
    return parse(str(backend)), parse(str(c10d["_world"].pg_map[c10d["_get_default_group"]()][0]))


def serves(requested: dict[str, str], world: dict[str, str]) -> bool:
    """Whether every device type of ``requested`` uses the same backend in ``world``
    (:func:`backend_devices`): then ``split_group`` can make the group from the default group."""
    return all(world.get(device) == name for device, name in requested.items())
