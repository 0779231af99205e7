"""A plain backend name given to ``new_group`` / ``split_group`` on the route (torch 2.13), read
as the device types where the world's group uses that backend.

On the route, 2.13's ``new_group`` delegates to ``split_group``, which reads its ``backend``
argument and the parent group's backend string with ``_parse_backend_string``: a plain name maps
to the device types whose *default* backend it is (``"gloo"``: cpu and mps), while the groups
were made with ``BackendConfig``'s map (``"gloo"``: cpu and cuda). So ``new_group(backend="gloo")``
on a gloo world raised c10d's ``RuntimeError`` ("Requested device type for splitGroup is not
present in the parent process group: mps") on the members, while the ranks left out split the
communicator as non-members and waited there until the timeout; and a world made by
``init_process_group()`` without a backend (``"undefined"``) could not be split with any
``backend``. :func:`install` makes c10d read a plain name as the device types of the default
group's backend config that use it (``"gloo"`` on a ``cpu:gloo,cuda:nccl`` world: cpu), or,
where none does (``"undefined"``, a backend the world does not use), as ``BackendConfig`` maps
it; strings naming devices (``"cpu:gloo"``) are read by torch's own function.
"""
from __future__ import annotations

import sys
from collections.abc import Callable

_MARK = "_torchcomms_backend_config"


def _world_devices(c10d: object, backend: str, parse: Callable[[str], dict[str, str]]) -> dict[str, str]:
    """The device types of the default group's backend config that use ``backend`` (the config,
    ``"cpu:gloo,cuda:nccl"``, read by torch's own ``parse``)."""
    world = getattr(c10d, "_world", None)
    default = getattr(world, "default_pg", None)
    config = getattr(world, "pg_backend_config", {}).get(default) if default is not None else None
    if not config or ":" not in str(config):
        return {}
    return {device: name for device, name in parse(str(config)).items() if name == backend}


def _as_backend_config(parse: Callable[[str], dict[str, str]]) -> Callable[[str], dict[str, str]]:
    def parse_backend_string(backend: str) -> dict[str, str]:
        if ":" in str(backend):
            return parse(backend)
        from torch.distributed import distributed_c10d as c10d

        name = str(backend).lower()
        try:
            return (_world_devices(c10d, name, parse)
                    or dict(c10d.BackendConfig(c10d.Backend(name)).get_device_backend_map()))
        except ValueError:
            return parse(backend)

    setattr(parse_backend_string, _MARK, True)
    return parse_backend_string


def install() -> None:
    """Replaces c10d's ``_parse_backend_string`` (torch 2.13; absent in 2.11, whose ``new_group``
    does not split) by the reading above, once per process."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    parse = getattr(c10d, "_parse_backend_string", None)
    if parse is not None and not getattr(parse, _MARK, False):
        c10d._parse_backend_string = _as_backend_config(parse)  # type: ignore[union-attr]
