"""The communicators one c10d split call splits: one split per device type of the parent group.

c10d's ``ProcessGroup.split_group`` splits the backend of each device type of the parent (those
its ``backend`` names, where given), in the order of the group's device types, and 2.13's
``new_group`` splits each device type's communicator of the default group on the ranks it
leaves out, in that order too. A group of one backend for several device types (gloo: cpu and
cuda) splits its communicator once per device type; a group of one backend per device type
(``"cpu:gloo,cuda:nccl"``) splits each communicator once. A rank that refuses the call's member
list (:meth:`torchcomms._comms.forward.CommForwarder.split`) takes part in those splits as a
non-member, so that every communicator of the parent stays in step with the other ranks.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torchcomms.core.c10d_lists import c10d_frame


def device_comms(group: Any, devices: Iterable[Any] | None = None) -> list[Any]:
    """The communicator of each device type of ``group`` (a c10d ``ProcessGroup`` on the route), in
    the group's order of device types, one entry per device type; only the device types of
    ``devices`` (``torch.device``s or names), where given."""
    import torch

    wanted = None if devices is None else {torch.device(d).type for d in devices}
    comms = []
    for device in group._device_types:
        if wanted is not None and torch.device(device).type not in wanted:
            continue
        get_comm = getattr(group._get_backend(device), "get_comm", None)
        if get_comm is not None:
            comms.append(get_comm())
    return comms


def split_call_comms(comm: Any, max_depth: int = 12) -> list[Any]:
    """The communicators that the c10d ``split_group`` call among the callers splits
    (:func:`device_comms` of its parent, filtered by its ``backend``), which must include
    ``comm``; else (a split called otherwise) ``comm`` once per device type of the default group
    that it serves (at least once)."""
    frame = c10d_frame(("split_group",), max_depth)
    if frame is not None:
        local = frame.f_locals
        parent = local.get("parent_pg")
        if parent is not None:
            comms = device_comms(parent, local.get("device_types_filter"))
            if any(c is comm for c in comms):
                return comms
    from torch.distributed import distributed_c10d as c10d

    served = [c for c in device_comms(c10d._get_default_group()) if c is comm] if c10d.is_initialized() else []
    return served or [comm]
