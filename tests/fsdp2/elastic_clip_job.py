"""Gradient clipping in elastic HSDP (2 replicas x 2 shards, ``train_batch(...,
max_grad_norm=)``) against the anchor: ``fsdp2.fully_shard`` HSDP on the same 4 ranks with
``torch.nn.utils.clip_grad_norm_`` before each SGD step, from the same weights on the same
samples. Writes, per rank, both runs' losses and norms as JSON to ``<argv[1]>.<rank>``."""
from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch

import fsdp2
import torchcomms
from fsdp2.elastic_batch import split_in_order
from tests.fsdp2.elastic_frozen_job import Net, sharded_net

STEPS, BATCH, MAX_NORM, LR = 4, 8, 0.05, 0.5


def sample(i: int) -> torch.Tensor:
    return torch.randn(6, generator=torch.Generator().manual_seed(i))


def loss_on(model: torch.nn.Module, indices: list[int]) -> torch.Tensor:
    return model(torch.stack([sample(i) for i in indices]))


def elastic() -> tuple[list[float], list[float]]:
    el, model = sharded_net()
    assert el.start(model, torch.optim.SGD(model.parameters(), lr=LR))
    losses, norms = [], []
    while el.step < STEPS:
        res = el.train_batch(lambda idx: loss_on(model, idx), BATCH, max_grad_norm=MAX_NORM)
        losses.append(res.loss)
        norms.append(res.grad_norm)
    el.finish()
    return losses, norms


def anchor(rank: int) -> tuple[list[float], list[float]]:
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="anchor", timeout=timedelta(seconds=30))
    torch.manual_seed(0)
    model = Net()
    for b in model.blocks:
        fsdp2.fully_shard(b, comm, replicate_size=2)
    fsdp2.fully_shard(model, comm, replicate_size=2)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, norms = [], []
    for step in range(STEPS):
        mine = split_in_order(range(step * BATCH, (step + 1) * BATCH), range(4))[rank]
        loss = loss_on(model, mine)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).full_tensor().item())
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        comm.all_reduce(mean, torchcomms.ReduceOp.AVG, async_op=False)
        losses.append(mean.item())
    fsdp2.release_comms(fsdp2.comms_of(model))
    comm.finalize()
    return losses, norms


def main(out: str) -> None:
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    an_losses, an_norms = anchor(rank)  # first: elastic's mesh leaves a default group of its shard ranks
    el_losses, el_norms = elastic()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"elastic": {"losses": el_losses, "norms": el_norms},
                   "anchor": {"losses": an_losses, "norms": an_norms}}, f)


if __name__ == "__main__":
    main(sys.argv[1])
