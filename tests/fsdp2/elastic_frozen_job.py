"""An elastic HSDP job (2 replicas x 2 shards) whose model has frozen parameters
(``requires_grad=False``) and a layer its forward never uses, trained with AdamW (weight decay
0.1) over all of ``model.parameters()``: writes, per rank, how far each parameter moved and which
ones have optimizer state, as JSON to ``<argv[1]>.<rank>``."""
from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch
from torch import nn

from fsdp2.elastic import ElasticHSDP


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(6, 16)
        self.frozen.requires_grad_(False)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.unused = nn.Linear(16, 3)  # never called: gets no gradient
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.frozen(x)
        for b in self.blocks:
            h = torch.tanh(b(h))
        return self.head(h).pow(2).mean()


def sharded_net() -> tuple[ElasticHSDP, Net]:
    """An elastic HSDP of 2 replicas x 2 shards and a :class:`Net` (seed 0) sharded on it, per
    block and at the root."""
    el = ElasticHSDP(shard_size=2, timeout=timedelta(seconds=30))
    torch.manual_seed(0)
    model = Net()
    for b in model.blocks:
        el.fully_shard(b)
    el.fully_shard(model)
    return el, model


def main(out: str) -> None:
    torch.set_num_threads(1)
    el, model = sharded_net()
    before = {n: p.to_local().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    assert el.start(model, opt)

    def loss_of(indices: list[int]) -> torch.Tensor:
        x = torch.stack([torch.randn(6, generator=torch.Generator().manual_seed(i)) for i in indices])
        return model(x)

    for _ in range(3):
        el.train_batch(loss_of, 8)
    params = dict(model.named_parameters())
    moved = {n: (p.to_local() - before[n]).abs().max().item() for n, p in params.items()}
    with_state = sorted(n for n, p in params.items() if opt.state.get(p))
    with open(f"{out}.{el.rank}", "w") as f:
        json.dump({"moved": moved, "with_state": with_state}, f)
    el.finish()


if __name__ == "__main__":
    main(sys.argv[1])
