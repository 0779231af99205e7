"""What users do through ``torch.distributed`` besides training loops, on our communicators
(TORCH_DISTRIBUTED_USE_TORCHCOMMS=1): tensor layouts.

An all-reduce (or broadcast, reduce) of a dense tensor in another dimension order (channels_last,
a transpose), which c10d's gloo runs, raised CommValueError ("tensor must be contiguous")."""
from __future__ import annotations

import torch

from tests.dist.test_route_programs import ROUTE
from tests.helpers.ranks import run_ranks

WORKERS = "tests.dist.usage_workers"


def test_dense_tensors_in_another_dimension_order() -> None:
    want = {"all_reduce": (2 * torch.arange(24.0) + 1).tolist(),
            "broadcast": (torch.arange(12.0).reshape(3, 4) * 2).t().flatten().tolist(),
            "reduce": (torch.arange(6.0).reshape(2, 3) + 10).t().flatten().tolist(),
            "strides": [12, 1, 6, 3]}  # the output keeps its channels_last layout
    for env in (ROUTE, {}):
        for res in run_ranks(2, f"{WORKERS}:dense_layouts", timeout=120, env=env):
            assert res.value == dict(want, reduce=want["reduce"] if res.rank == 0 else None), (env, res.value)
