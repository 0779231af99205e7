"""Rank code for the engine-neutral complex-tensor tests: ops that move complex data without
reducing it, their results checked on every rank against what each rank sent."""
from __future__ import annotations

from typing import Any

import torch

import torchcomms
from tests.torchcomms.workers import engine


def _mine(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s ``n`` values: real and imaginary parts both name the rank and the index."""
    i = torch.arange(n, dtype=torch.float64)
    return torch.complex(rank * 100 + i, -(rank * 100 + i) - 0.5).to(dtype)


def moved(dtype_name: str) -> dict[str, Any]:
    """all_gather (list, single, v), all_to_all (single, v, list), broadcast, scatter and gather of
    complex tensors: for each op, whether every element is what its sender put there."""
    dtype = getattr(torch, dtype_name)
    comm = torchcomms.new_comm(engine(), torch.device("cpu"), "complex-moved")
    r, n = comm.get_rank(), comm.get_size()
    ok: dict[str, Any] = {}

    def each(name: str, call: Any) -> None:
        try:
            ok[name] = bool(call())
        except Exception as e:  # noqa: BLE001 - the test names the op that raised
            ok[name] = f"{type(e).__name__}: {e}"

    def gather_list() -> bool:
        out = [torch.empty(4, dtype=dtype) for _ in range(n)]
        comm.all_gather(out, _mine(r, 4, dtype), False)
        return all(torch.equal(out[p], _mine(p, 4, dtype)) for p in range(n))

    def gather_single() -> bool:
        out = torch.empty(4 * n, dtype=dtype)
        comm.all_gather_single(out, _mine(r, 4, dtype), False)
        return torch.equal(out, torch.cat([_mine(p, 4, dtype) for p in range(n)]))

    def gather_v() -> bool:
        out = [torch.empty(p + 1, dtype=dtype) for p in range(n)]
        comm.all_gather_v(out, _mine(r, r + 1, dtype), False)
        return all(torch.equal(out[p], _mine(p, p + 1, dtype)) for p in range(n))

    def to_all_single() -> bool:
        out = torch.empty(2 * n, dtype=dtype)
        comm.all_to_all_single(out, _mine(r, 2 * n, dtype), False)
        return torch.equal(out, torch.cat([_mine(p, 2 * n, dtype)[2 * r:2 * r + 2] for p in range(n)]))

    def to_all_v() -> bool:  # rank p sends q pieces of (q + 1) elements... each peer q gets q + 1 of them
        sent = _mine(r, sum(q + 1 for q in range(n)), dtype)
        out = torch.empty(n * (r + 1), dtype=dtype)
        comm.all_to_all_v_single(out, sent, [r + 1] * n, [q + 1 for q in range(n)], False)
        start = sum(q + 1 for q in range(r))
        return torch.equal(out, torch.cat([_mine(p, sent.numel(), dtype)[start:start + r + 1] for p in range(n)]))

    def to_all_list() -> bool:
        out = [torch.empty(3, dtype=dtype) for _ in range(n)]
        comm.all_to_all(out, [_mine(r, 3 * n, dtype)[3 * q:3 * q + 3] for q in range(n)], False)
        return all(torch.equal(out[p], _mine(p, 3 * n, dtype)[3 * r:3 * r + 3]) for p in range(n))

    def broadcast() -> bool:
        t = _mine(r, 5, dtype)
        comm.broadcast(t, 1, False)
        return torch.equal(t, _mine(1, 5, dtype))

    def scatter() -> bool:
        out = torch.empty(2, dtype=dtype)
        comm.scatter(out, [_mine(0, 2 * n, dtype)[2 * q:2 * q + 2] for q in range(n)] if r == 0 else [], 0, False)
        return torch.equal(out, _mine(0, 2 * n, dtype)[2 * r:2 * r + 2])

    def gather() -> bool:
        out = [torch.empty(3, dtype=dtype) for _ in range(n)] if r == 0 else []
        comm.gather(out, _mine(r, 3, dtype), 0, False)
        return r != 0 or all(torch.equal(out[p], _mine(p, 3, dtype)) for p in range(n))

    for name, call in [("all_gather", gather_list), ("all_gather_single", gather_single), ("all_gather_v", gather_v),
                       ("all_to_all_single", to_all_single), ("all_to_all_v_single", to_all_v),
                       ("all_to_all", to_all_list), ("broadcast", broadcast), ("scatter", scatter),
                       ("gather", gather)]:
        each(name, call)
    comm.finalize()
    return ok
