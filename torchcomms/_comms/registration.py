"""The route's backend registered under its engine's c10d backend type (torch 2.11).

c10d's process-group helper sets the group's default backend type from the backend's name
(``"gloo"``: GLOO) and, on 2.11's route, registers our ``_BackendWrapper`` under CUSTOM, so
everything that asks the group for its default backend failed in c10d itself: DDP raised
``RuntimeError("Could not find backend type 1 for Process Group with name gloo")``. 2.13
registers it under the engine's type. :func:`register_as_engine_type` registers the wrapper under
that type too, on the group the helper is making, before the helper registers it its own way.
"""
from __future__ import annotations

from typing import Any


def register_as_engine_type(backend: Any) -> None:
    """Registers ``backend`` on the group of c10d's process-group helper call (if one is among
    the callers) for the helper's device, under the c10d type of the helper's backend name
    (nothing for a name c10d has no type of)."""
    from torchcomms.setup.bootstrap import c10d_helper_call

    helper = c10d_helper_call()
    if helper is None or not {"pg", "device", "backend_str"} <= helper.keys():
        return
    import torch
    from torch.distributed import distributed_c10d as c10d

    kind = c10d.Backend.backend_type_map.get(str(helper["backend_str"]))
    if kind is not None and kind != c10d.ProcessGroup.BackendType.CUSTOM:
        helper["pg"]._register_backend(torch.device(helper["device"]), kind, backend)
