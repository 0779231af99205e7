"""A ``torch.distributed.DeviceMesh`` whose dimensions are torchcomms communicators.

Each communicator is wrapped in a registered ``ProcessGroup`` whose c10d backend is
:class:`torchcomms._comms._BackendWrapper`, so DTensor, FSDP2 and tensor parallel, which talk to
the mesh's process groups, run their collectives through the communicators' dispatch path.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh

__all__ = ["init_device_mesh"]

_BACKEND_NAME = "torchcomm"


def _ensure_backend_name(name: str) -> None:
    """``dist.get_backend(pg)`` reads the group's backend name back through ``dist.Backend``."""
    if name.lower() in dist.Backend.backend_list:
        return

    def _refuse(*_: Any, **__: Any) -> None:
        raise RuntimeError(f"backend {name!r} is made by torchcomms.device_mesh from existing communicators; "
                           "init_process_group cannot create it")

    dist.Backend.register_backend(name, _refuse, devices=["cpu", "cuda"])


def _create_torchcomm_process_group(comm: Any, group_name: str, backend_str: str = _BACKEND_NAME,
                                    global_ranks_mapping: dict[int, int] | None = None) -> dist.ProcessGroup:
    """Wrap ``comm`` as a registered ``ProcessGroup`` named ``group_name``.

    ``global_ranks_mapping`` maps global rank -> rank in ``comm`` (default: the identity, for a
    communicator over the whole job).
    """
    from torchcomms._comms import _BackendWrapper

    _ensure_backend_name(backend_str)
    rank, size = comm.get_rank(), comm.get_size()
    device = torch.device(comm.get_device().type)
    pg = dist.ProcessGroup(rank, size)
    backend_type = dist.ProcessGroup.BackendType.CUSTOM
    pg._set_default_backend(backend_type)
    pg._register_backend(device, backend_type, _BackendWrapper(comm))
    pg._set_group_name(group_name)
    pg._set_group_desc(group_name)
    mapping = dict(global_ranks_mapping) if global_ranks_mapping is not None else {r: r for r in range(size)}
    config = f"{device.type}:{backend_str}"
    if hasattr(c10d, "_register_pg_in_world"):
        c10d._register_pg_in_world(pg, backend_name=backend_str, store=None, group_name=group_name,
                                   backend_config=config, rank_mapping=mapping)
    else:  # torch versions without the helper: the same global tables by hand
        c10d._world.pg_map[pg] = (backend_str, None)
        c10d._world.pg_names[pg] = group_name
        c10d._register_process_group(group_name, pg)
        c10d._world.pg_backend_config[pg] = config
        c10d._world.pg_group_ranks[pg] = mapping
        c10d._world.tags_to_pg.setdefault(f"ptd:{group_name}", []).append(pg)
        c10d._world.pg_to_tag[pg] = f"ptd:{group_name}"
    return pg


def _global_rank_of_members(comm: Any, local: torch.Tensor) -> torch.Tensor:
    out = torch.empty(comm.get_size() * local.numel(), dtype=local.dtype, device=local.device)
    comm.all_gather_single(out, local.reshape(-1).contiguous(), False)
    return out.view(comm.get_size(), *local.shape)


def init_device_mesh(mesh_dim_comms: tuple[Any, ...], mesh_dim_names: tuple[str, ...],
                     _global_comm: Any | None = None) -> DeviceMesh:
    """A DeviceMesh with one dimension per communicator (its size is that communicator's size).

    torch.distributed must be initialized, or ``_global_comm`` (a communicator over every rank)
    given: it then becomes the default process group. Collective over every rank.
    """
    comms = tuple(mesh_dim_comms)
    if not comms:
        raise ValueError("init_device_mesh: mesh_dim_comms is empty")
    if len(mesh_dim_names) != len(comms):
        raise ValueError(f"init_device_mesh: {len(comms)} communicators but {len(mesh_dim_names)} mesh_dim_names")
    if len(set(mesh_dim_names)) != len(mesh_dim_names):
        raise ValueError(f"init_device_mesh: mesh_dim_names must be unique, got {mesh_dim_names}")
    if not dist.is_initialized():
        if _global_comm is None:
            raise ValueError("init_device_mesh: torch.distributed is not initialized; pass _global_comm "
                             "(a communicator over every rank) to serve as the default group")
        world = _create_torchcomm_process_group(_global_comm, f"{_global_comm.get_name()}")
        c10d._update_default_pg(world)
    device = comms[0].get_device()
    me = torch.tensor([dist.get_rank()], dtype=torch.int64, device=device)
    mesh = me
    for comm in reversed(comms):
        mesh = _global_rank_of_members(comm, mesh)
    mesh = mesh.view(*(c.get_size() for c in comms)).cpu()
    groups = []
    for dim, (comm, name) in enumerate(zip(comms, mesh_dim_names)):
        members = _members_along(mesh, dim, dist.get_rank())
        groups.append(_create_torchcomm_process_group(
            comm, f"{comm.get_name()}:mesh:{name}", global_ranks_mapping={g: i for i, g in enumerate(members)}))
    if len(groups) == 1:
        return DeviceMesh.from_group(groups[0], device.type, mesh=mesh.tolist(), mesh_dim_names=tuple(mesh_dim_names))
    return DeviceMesh.from_group(groups, device.type, mesh=mesh, mesh_dim_names=tuple(mesh_dim_names))


def _members_along(mesh: torch.Tensor, dim: int, rank: int) -> list[int]:
    """Global ranks of ``rank``'s group along ``dim`` of ``mesh``, in rank order of that group."""
    coords = (mesh == rank).nonzero()[0].tolist()
    index: list[Any] = list(coords)
    index[dim] = slice(None)
    return mesh[tuple(index)].tolist()


def _flatten_with_comm(mesh: DeviceMesh, mesh_dim_name: str, comm: Any, global_ranks: list[int],
                       layout: Any) -> DeviceMesh:
    """A one-dimensional mesh named ``mesh_dim_name`` over ``global_ranks``, backed by ``comm``."""
    if comm.get_size() != len(global_ranks):
        raise ValueError(f"_flatten_with_comm: communicator size {comm.get_size()} != {len(global_ranks)} ranks")
    pg = _create_torchcomm_process_group(comm, f"{comm.get_name()}:flat:{mesh_dim_name}",
                                         global_ranks_mapping={g: i for i, g in enumerate(global_ranks)})
    flat = DeviceMesh.from_group(pg, mesh.device_type, mesh=list(global_ranks), mesh_dim_names=(mesh_dim_name,))
    mapping = getattr(mesh, "_flatten_mapping", None)
    if isinstance(mapping, dict):
        mapping[mesh_dim_name] = flat
    return flat
