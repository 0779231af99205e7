"""The communicators FSDP runs on, split once from the user's communicator, and the c10d mesh
that carries FSDP's DTensor metadata.

Layout (as ``init_device_mesh((replicate, shard))``): rank ``r`` is in shard group
``r // shard_size`` and replica group ``r % shard_size``. With ``separate=True`` the all-gather
and the reduce-scatter each get their own communicator (their own engine thread on CPU, their
own stream and NCCL communicator on GPU), so they overlap; with ``separate=False`` both run on
one communicator split for the shard group (``<name>.fsdp.shard``). The HSDP all-reduce always has its own.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from fsdp2.collectives import FSDPCommError, Reductions

#: metadata c10d groups use this prefix of the communicator's store (then the communicator's
#: name and the how-many-th metadata group of this process it is: every rank counts alike)
METADATA_STORE_PREFIX = "fsdp2/metadata/"
_METADATA_GROUPS = itertools.count()


@dataclass
class FSDPComms:
    """The communicators of one FSDP job, built by :meth:`build` (collective over ``parent``)."""

    parent: Any
    replicate_size: int
    shard_size: int
    all_gather: Any
    reduce_scatter: Any
    all_reduce: Any | None
    mesh: DeviceMesh  # the shard-dimension mesh FSDP's DTensors live on
    global_mesh: DeviceMesh  # (replicate, shard), or 1-D (shard) for plain FSDP
    separate: bool
    reductions: Reductions = field(default_factory=Reductions)
    #: the all-gather communicators of ``reshard_after_forward=n`` (n ranks each), by ``n``
    post_forward: dict[int, Any] = field(default_factory=dict)

    @property
    def is_hsdp(self) -> bool:
        return self.replicate_size > 1

    @classmethod
    def build(cls, parent: Any, *, replicate_size: int = 1, separate: bool = True,
              device_type: str | None = None) -> FSDPComms:
        """Split ``parent`` into FSDP's communicators and make (or reuse) the metadata mesh.

        Collective: every rank of ``parent`` calls it with the same arguments.
        """
        world = parent.get_size()
        if not isinstance(replicate_size, int) or replicate_size < 1 or world % replicate_size:
            raise FSDPCommError(
                f"replicate_size must be a positive divisor of the world size {world}, got {replicate_size!r}")
        shard_size = world // replicate_size
        rank = parent.get_rank()
        r_idx, s_idx = divmod(rank, shard_size)
        shard_ranks = [r_idx * shard_size + j for j in range(shard_size)]
        replica_ranks = [i * shard_size + s_idx for i in range(replicate_size)]
        base = parent.get_name()
        if separate:
            ag = parent.split(shard_ranks, f"{base}.fsdp.all_gather")
            rs = parent.split(shard_ranks, f"{base}.fsdp.reduce_scatter")
        else:
            ag = rs = parent.split(shard_ranks, f"{base}.fsdp.shard")
        ar = parent.split(replica_ranks, f"{base}.fsdp.all_reduce") if replicate_size > 1 else None
        assert {c.get_name() for c in (ag, rs, ar) if c is not None} == split_names(base, replicate_size, separate)
        dev = device_type or parent.get_device().type
        global_mesh = metadata_mesh(parent, dev, replicate_size, shard_size)
        mesh = global_mesh["shard"] if replicate_size > 1 else global_mesh
        return cls(parent, replicate_size, shard_size, ag, rs, ar, mesh, global_mesh, separate)

    def post_forward_comm(self, size: int) -> Any:
        """The communicator of this rank's post-forward group for ``reshard_after_forward=size``:
        ``size`` consecutive ranks of the shard group, as torch's post-forward mesh (the shard
        mesh viewed as ``(-1, size)``). Split from the all-gather communicator on first use
        (collective over it then)."""
        got = self.post_forward.get(size)
        if got is None:
            first = self.all_gather.get_rank() // size * size
            got = self.post_forward[size] = self.all_gather.split(
                list(range(first, first + size)), f"{self.all_gather.get_name()}.post_forward{size}")
        return got

    def communicators(self) -> list[Any]:
        seen: list[Any] = []
        for c in (self.all_gather, self.reduce_scatter, self.all_reduce, *self.post_forward.values()):
            if c is not None and all(c is not s for s in seen):
                seen.append(c)
        return seen

    def finalize(self) -> None:
        """Finalize the split communicators (not ``parent``, which the user owns): their
        in-flight work is drained first."""
        self.reductions.close()
        for c in self.communicators():
            c.finalize()

    def abort(self) -> None:
        """Abort the split communicators (after a failure: nothing is waited for; never raises)."""
        self.reductions.close()
        for c in self.communicators():
            c.abort()


def split_names(base: str, replicate_size: int, separate: bool) -> set[str]:
    """The names of the communicators :meth:`FSDPComms.build` splits from communicator ``base``."""
    names = {f"{base}.fsdp.all_gather", f"{base}.fsdp.reduce_scatter"} if separate else {f"{base}.fsdp.shard"}
    return names | ({f"{base}.fsdp.all_reduce"} if replicate_size > 1 else set())


def metadata_mesh(parent: Any, device_type: str, replicate_size: int, shard_size: int) -> DeviceMesh:
    """The c10d DeviceMesh for FSDP's DTensor state. Initializes a default gloo (CPU) / nccl
    (CUDA) process group over ``parent``'s store when none exists. No collective of the training
    step runs on it; checkpointing (DCP) and ``DTensor.full_tensor()`` do."""
    if not dist.is_initialized():
        dist.init_process_group(
            "gloo" if device_type == "cpu" else f"cpu:gloo,{device_type}:nccl",
            store=dist.PrefixStore(f"{METADATA_STORE_PREFIX}{parent.get_name()}/{next(_METADATA_GROUPS)}/",
                                   _rendezvous_store(parent)),
            rank=parent.get_rank(), world_size=parent.get_size(),
            timeout=parent.get_options().timeout)
    if dist.get_world_size() != parent.get_size() or dist.get_rank() != parent.get_rank():
        raise FSDPCommError(
            f"the default process group (rank {dist.get_rank()} of {dist.get_world_size()}) does not match "
            f"communicator {parent.get_name()!r} (rank {parent.get_rank()} of {parent.get_size()})")
    if replicate_size > 1:
        return init_device_mesh(device_type, (replicate_size, shard_size), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (shard_size,), mesh_dim_names=("shard",))


def _rendezvous_store(parent: Any) -> Any:
    """The store the metadata group meets on: the one ``parent`` met on (its options' store,
    given to ``new_comm`` or found by it: the control plane's, or the TCPStore at
    MASTER_ADDR:MASTER_PORT); a private ``HashStore`` for a one-rank communicator without one."""
    store = parent.get_options().store
    if store is not None:
        return store
    if parent.get_size() == 1:
        return dist.HashStore()
    raise FSDPCommError(f"communicator {parent.get_name()!r} has no store to meet on: call "
                        "torch.distributed.init_process_group before fsdp2.fully_shard")
