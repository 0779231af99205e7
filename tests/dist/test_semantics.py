"""Semantics matched to the reference API: integer AVG, get_init_handle, unknown backends."""
from __future__ import annotations

import pytest
import torch

import torchcomms
from tests.helpers.ranks import run_ranks


def test_get_init_handle_without_enable_reconfigure() -> None:
    c = torchcomms.new_comm("fake", "cpu", "init-handle-plain", hints={"rank": "0", "size": "1"})
    handle = c.get_init_handle()
    assert isinstance(handle, str) and handle
    assert c.get_init_handle() == handle
    c.finalize()


def test_unknown_backend_is_a_module_not_found_error() -> None:
    with pytest.raises(ModuleNotFoundError, match="failed to find backend 'no-such-backend'"):
        torchcomms.new_comm("no-such-backend", torch.device("cpu"), "nb")


def test_integer_avg_is_the_truncated_sum() -> None:
    results = run_ranks(3, "tests.dist.comm_workers:integer_avg", timeout=120)
    for res in results:
        assert res.value["all_reduce"] == [2, -2, 7]  # 7/3 and -7/3 truncated toward zero
        assert res.value["reduce_scatter"] == [18 + res.rank]  # (55 + 3p) / 3 truncated
