"""Rank bodies: DDP's options and communication hooks through ``torch.distributed`` (route on or
off), each reporting its losses and final parameters."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.route_workers import _attach_recorder, _recorded


class Branchy(nn.Module):
    """Three layers; the middle one is used only when asked (``find_unused_parameters``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, use_b: bool = True) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.c(torch.relu(self.b(h)) if use_b else h)


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)


def _train(model: DDP, steps: int, accumulate: int = 1,
           forward: Callable[[DDP, torch.Tensor, int], torch.Tensor] | None = None) -> dict[str, Any]:
    """``steps`` SGD steps of ``accumulate`` micro-batches each (all but the last under
    ``no_sync``); the losses and the final parameters."""
    rank = dist.get_rank()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        for k in range(accumulate):
            x, y = _batch(rank, 10 * step + k)
            if k < accumulate - 1:
                with model.no_sync():
                    nn.functional.mse_loss(model(x), y).backward()
                continue
            loss = nn.functional.mse_loss(forward(model, x, step) if forward else model(x), y)
            loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "params": [p.detach().flatten().tolist() for p in model.parameters()]}


def _hooked(hook: Callable, state: Any = None, steps: int = 3) -> dict[str, Any]:
    model = DDP(Branchy())
    model.register_comm_hook(state, hook)
    return _train(model, steps)


def _uneven_join() -> dict[str, Any]:
    """Rank r trains on 2 + 2r batches under ``Join``: the ranks that run out shadow the others'
    all-reduces."""
    from torch.distributed.algorithms.join import Join

    model = DDP(Branchy())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Join([model]):
        for step in range(2 + 2 * dist.get_rank()):
            x, y = _batch(dist.get_rank(), step)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    return {"losses": [], "params": [p.detach().flatten().tolist() for p in model.parameters()]}


def variants() -> dict[str, Any]:
    """Every variant in turn on one default group."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    dist.init_process_group("gloo")
    rec = _attach_recorder()
    out: dict[str, Any] = {
        "unused": _train(DDP(Branchy(), find_unused_parameters=True), 3,
                         forward=lambda m, x, step: m(x, use_b=step % 2 == 0)),
        "no_sync": _train(DDP(Branchy()), 2, accumulate=3),
        "static_graph": _train(DDP(Branchy(), static_graph=True), 3),
        "small_buckets": _train(DDP(Branchy(), bucket_cap_mb=0.0001, gradient_as_bucket_view=True), 3),
        "allreduce_hook": _hooked(default_hooks.allreduce_hook),
        "fp16_hook": _hooked(default_hooks.fp16_compress_hook),
        # compressed from its third step: its hook all-reduces inside a future's callback and
        # waits there for that all-reduce's own future
        "powersgd": _hooked(powerSGD_hook.powerSGD_hook, powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2), steps=4),
        "join": _uneven_join(),
    }
    out["recorded"] = _recorded(rec)
    dist.destroy_process_group()
    return out


def peer_killed_before_backward(victim: int) -> dict[str, Any]:
    """DDP steps until rank ``victim`` SIGKILLs itself after its first step: the error the
    survivors' next ``backward()`` raises (DDP's reducer rethrows the failed all-reduce's
    future error inside the autograd engine)."""
    import os
    import signal

    dist.init_process_group("gloo")
    model = DDP(Branchy())
    out: dict[str, Any] = {"steps": 0}
    try:
        for step in range(3):
            x, y = _batch(dist.get_rank(), step)
            loss = nn.functional.mse_loss(model(x), y)
            if step == 1 and dist.get_rank() == victim:
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
            out["steps"] += 1
    except Exception as e:  # noqa: BLE001 - reported to the test
        out.update(error=type(e).__name__, mro=[c.__name__ for c in type(e).__mro__], message=str(e)[:300],
                   failed_ranks=getattr(e, "failed_ranks", None))
    return out


def compiled() -> dict[str, Any]:
    """``torch.compile`` (dynamo's eager backend: no code generation) of a DDP model beside the
    same model uncompiled, and of a function that waits on an async all-reduce: c10d calls the
    backend from their eager parts."""
    dist.init_process_group("gloo")

    @torch.compile(backend="eager")
    def doubled_sum(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y, async_op=True).wait()
        return y + 1

    out = {"eager": _train(DDP(Branchy()), 2), "compiled": _train(torch.compile(DDP(Branchy()), backend="eager"), 2),
           "waited": doubled_sum(torch.full((2,), float(dist.get_rank() + 1))).tolist()}
    dist.destroy_process_group()
    return out
