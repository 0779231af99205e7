"""Running a rank program with ``torch.distributed`` on our communicators (the route,
``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1``) and on c10d's own backends, to compare the two."""
from __future__ import annotations

from typing import Any

from tests.helpers.ranks import RankResult, run_ranks

#: the route on; a failed op raises in the rank instead of ending its process
ROUTE = {"TORCH_DISTRIBUTED_USE_TORCHCOMMS": "1", "TORCHCOMM_ABORT_ON_ERROR": "0"}


def on_and_off(world: int, target: str, kwargs: dict[str, Any] | None = None, timeout: float = 120.0,
               env: dict[str, str] = ROUTE) -> tuple[list[RankResult], list[RankResult]]:
    """Every rank's result of ``target`` with the route on (``env``), then with it off."""
    return run_ranks(world, target, kwargs, timeout=timeout, env=env), run_ranks(world, target, kwargs, timeout=timeout)
