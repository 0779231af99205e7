"""FSDP2 on torchcomms: torch's ``fully_shard`` (its sharding, hooks and DTensor state) with the
all-gather, the reduce-scatter and the HSDP all-reduce each on its own communicator split from
the one the user passes, so they overlap with compute and with each other.

    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="world")
    for block in model.blocks:
        fsdp2.fully_shard(block, comm)
    fsdp2.fully_shard(model, comm)
"""
from __future__ import annotations

from fsdp2.api import comms_of, fsdp_comms, fully_shard, release_comms
from fsdp2.collectives import CommAllGather, CommReduceScatter, FSDPCommError, ReplicaAllReduce, Reductions
from fsdp2.groups import FSDPComms
from fsdp2.work import CommWork

__all__ = [
    "CommAllGather", "CommReduceScatter", "CommWork", "FSDPCommError", "FSDPComms", "ReplicaAllReduce",
    "Reductions", "comms_of", "fsdp_comms", "fully_shard", "release_comms",
]
