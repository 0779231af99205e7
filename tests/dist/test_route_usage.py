"""What users do through ``torch.distributed`` besides training loops, on our communicators
(TORCH_DISTRIBUTED_USE_TORCHCOMMS=1): tensor layouts, DeviceMesh and DTensor redistribution,
functional collectives, DCP with torch's FSDP2.

An all-reduce (or broadcast, reduce) of a dense tensor in another dimension order (channels_last,
a transpose), which c10d's gloo runs, raised CommValueError ("tensor must be contiguous")."""
from __future__ import annotations

from pathlib import Path

import torch

from tests.dist.route_runs import ROUTE, on_and_off
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


def test_views_are_run_through_copies_or_refused_with_a_typed_error() -> None:
    # a non-contiguous output of all_gather_into_tensor / reduce_scatter_tensor raised a bare
    # RuntimeError from the forwarder's own view() ("view size is not compatible ..."); then
    # CommValueError, as did the views of the list forms that c10d's gloo runs right (all_gather
    # into out.chunk(n, dim=1), ...), and gather's / scatter's views on the root only: the other
    # ranks waited in the op until the timeout, and the communicator was broken
    for res in run_ranks(2, f"{WORKERS}:strided_layouts", timeout=120, env=ROUTE):
        v = res.value
        assert v.pop("after") == 2.0
        for name, (got, want) in v.pop("copied").items():
            assert got == want, (res.rank, name, got, want)
        for name, (kind, is_value_error, message) in v.items():
            assert kind == "CommValueError" and is_value_error and "must be contiguous" in message, (name, message)


def test_device_mesh_and_dtensor_redistribution_same_as_c10d() -> None:
    on, off = on_and_off(4, f"{WORKERS}:mesh_and_dtensor", timeout=180)
    for a, b in zip(on, off):
        assert a.value == b.value, (a.rank, a.value, b.value)
        r = a.rank
        assert a.value["local"] == [r // 2, r % 2, r]
        assert a.value["sums"] == [float(2 * (r % 2) + 2), float(4 * (r // 2) + 1), 6.0]
        assert a.value["line"][3] == (torch.arange(8.0) * 10).tolist()  # Partial -> Replicate: the sum
        assert a.value["grid"][2] == torch.arange(32.0).tolist()


def test_functional_collectives_and_wait_tensor() -> None:
    n = 2
    xs = [torch.arange(4.0) + q for q in range(n)]
    for res in run_ranks(n, f"{WORKERS}:functional_collectives", timeout=120, env=ROUTE):
        r = res.rank
        rs_in = sum(torch.arange(4.0 * n) * (q + 1) for q in range(n))
        assert res.value["values"] == [
            sum(xs).tolist(), torch.cat(xs).tolist(), rs_in[4 * r:4 * r + 4].tolist(), (sum(xs) / n).tolist(),
            [float(r + 10 * q) for q in range(n)], torch.stack(xs).max(0).values.tolist()]


def test_dcp_round_trip_of_fsdp2_state(tmp_path: Path) -> None:
    for res in run_ranks(2, f"{WORKERS}:dcp_round_trip", {"path": str(tmp_path / "ckpt")}, timeout=180, env=ROUTE):
        v = res.value
        assert v["loaded"] == v["saved"] and v["next_loaded"] == v["next"], res.rank
        assert v["next"] != v["saved"]  # the optimizer state came back too: the next step matches


def test_rank_and_world_size_given_as_arguments_only() -> None:
    # with no rank or size variable in the environment, each process's communicator was rank 0
    # of 1: every collective returned its own input (all_gather refused a list of n tensors)
    on, off = on_and_off(3, f"{WORKERS}:rank_and_world_size_arguments", timeout=120)
    for a, b in zip(on, off):
        assert a.value == b.value == {"rank": a.rank, "sum": [6.0, 6.0], "broadcast": [2.0],
                                      "gathered": [0.0, 10.0, 20.0]}, (a.rank, a.value, b.value)
