"""Rank/size discovery order and device resolution."""
from __future__ import annotations

import pytest
import torch

from torchcomms.setup.bootstrap import discover_rank_size, resolve_device
from torchcomms.core.errors import CommValueError


@pytest.mark.parametrize(
    "env,want",
    [
        ({"TORCHCOMM_RANK": "1", "TORCHCOMM_SIZE": "3", "RANK": "0", "WORLD_SIZE": "9"}, (1, 3)),
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "RANK": "0", "WORLD_SIZE": "9"}, (2, 4)),
        ({"PMI_RANK": "3", "PMI_SIZE": "5", "RANK": "0", "WORLD_SIZE": "9"}, (3, 5)),
        ({"RANK": "4", "WORLD_SIZE": "6", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, (4, 6)),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, (1, 2)),
        ({}, (0, 1)),
    ],
)
def test_discovery_order(env: dict[str, str], want: tuple[int, int]) -> None:
    assert discover_rank_size(env)[:2] == want


def test_forced_method() -> None:
    env = {"TORCHCOMM_RANK": "1", "TORCHCOMM_SIZE": "3", "RANK": "2", "WORLD_SIZE": "4",
           "TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD": "torchrun"}
    assert discover_rank_size(env)[:2] == (2, 4)
    with pytest.raises(CommValueError, match="forced"):
        discover_rank_size({"TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD": "mpi"})
    with pytest.raises(CommValueError, match="expected one of"):
        discover_rank_size({"TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD": "carrier-pigeon"})


@pytest.mark.parametrize(
    "env,match",
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "not a valid"),
        ({"RANK": "0"}, "WORLD_SIZE is not"),
    ],
)
def test_bad_environment(env: dict[str, str], match: str) -> None:
    with pytest.raises(CommValueError, match=match):
        discover_rank_size(env)


def test_device_resolution() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(CommValueError, match="invalid device"):
        resolve_device("not-a-device")
