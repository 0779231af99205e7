"""Rank functions of the fsdp2 multi-process tests (run by tests.helpers.ranks)."""
from __future__ import annotations

import hashlib
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.fsdp import fully_shard as torch_fully_shard

import fsdp2
import torchcomms
from kernels.model import Llama, LlamaConfig

VOCAB = 512


def make_model(seed: int = 0, n_layers: int = 2) -> Llama:
    torch.manual_seed(seed)
    return Llama(LlamaConfig.tiny(loss_impl="torch", n_layers=n_layers))


def batches(rank: int, steps: int, batch: int = 2, seq: int = 32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + rank)
    return [torch.randint(0, VOCAB, (batch, seq + 1), generator=g) for _ in range(steps)]


def mp_policy(mp: bool) -> MixedPrecisionPolicy:
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mp else MixedPrecisionPolicy()


def train(model: torch.nn.Module, data: list[torch.Tensor], lr: float = 1e-2) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    losses = []
    for tok in data:
        loss = model(tok[:, :-1], tok[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


def digest(params: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for n in sorted(params):
        h.update(n.encode())
        h.update(params[n].float().numpy().tobytes())
    return h.hexdigest()


def world_comm(name: str = "world", timeout_s: float = 60.0) -> Any:
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=name,
                               abort_process_on_timeout_or_error=False, timeout=timedelta(seconds=timeout_s))


def shard_ours(model: Llama, comm: Any, **kw: Any) -> Llama:
    for blk in model.blocks:
        fsdp2.fully_shard(blk, comm, **kw)
    fsdp2.fully_shard(model, comm, **kw)
    return model


def shard_stock(model: Llama, mesh: Any, **kw: Any) -> Llama:
    for blk in model.blocks:
        torch_fully_shard(blk, mesh=mesh, **kw)
    torch_fully_shard(model, mesh=mesh, **kw)
    return model


def numerics(steps: int = 20, replicate: int = 1, mp: bool = False, overlap: bool = True) -> dict[str, Any]:
    """Train the tiny Llama with stock fully_shard (c10d gloo) and with fsdp2 from the same
    initial weights and data; return both loss curves and max |Δ| of the final parameters."""
    rank = int(os.environ["RANK"])
    comm = world_comm()
    ours = shard_ours(make_model(), comm, mp_policy=mp_policy(mp), replicate_size=replicate, overlap=overlap)
    comms = fsdp2.comms_of(ours)
    data = batches(rank, steps)
    our_losses = train(ours, data)
    our_params = full_params(ours)
    stock = shard_stock(make_model(), comms.global_mesh, mp_policy=mp_policy(mp))
    stock_losses = train(stock, data)
    stock_params = full_params(stock)
    max_diff = max((our_params[n] - stock_params[n]).abs().max().item() for n in our_params)
    return {"ours": our_losses, "stock": stock_losses, "max_param_diff": max_diff,
            "ours_digest": digest(our_params), "stock_digest": digest(stock_params)}


def grads_once(overlap: bool = True) -> dict[str, Any]:
    rank = int(os.environ["RANK"])
    comm = world_comm()
    ours = shard_ours(make_model(), comm, overlap=overlap)
    comms = fsdp2.comms_of(ours)
    tok = batches(rank, 1)[0]
    ours(tok[:, :-1], tok[:, 1:]).backward()
    pending = comms.reductions.pending()
    g1 = {n: p.grad.full_tensor() for n, p in ours.named_parameters()}
    stock = shard_stock(make_model(), comms.global_mesh)
    stock(tok[:, :-1], tok[:, 1:]).backward()
    g2 = {n: p.grad.full_tensor() for n, p in stock.named_parameters()}
    return {"pending": pending, "diff": {n: (g1[n] - g2[n]).abs().max().item() for n in g1},
            "norm": {n: g2[n].norm().item() for n in g1}}
