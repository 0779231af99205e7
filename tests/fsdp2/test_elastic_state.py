"""The scheduler part of the state a healing replica receives (``fsdp2.elastic_state``): it
travels as JSON, so a scheduler whose state is not JSON is refused when training starts."""
from __future__ import annotations

import json

import pytest
import torch

from fsdp2.collectives import FSDPCommError
from fsdp2.elastic_state import check_scheduler, state_meta


def _opt() -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], lr=1.0)


def test_scheduler_state_round_trips_through_json() -> None:
    opt = _opt()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
    for _ in range(3):
        opt.step()
        sched.step()
    meta = json.loads(json.dumps(state_meta([], opt, sched)))
    other_opt = _opt()
    other = torch.optim.lr_scheduler.LambdaLR(other_opt, lambda s: 0.5 ** s)
    other.load_state_dict(meta["scheduler"])
    other_opt.param_groups[0]["lr"] = meta["groups"][0]["lr"]
    other_opt.step()
    other.step()
    opt.step()
    sched.step()
    assert other.last_epoch == sched.last_epoch == 4
    assert other_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.5 ** 4


def test_scheduler_without_json_state_is_refused_by_name() -> None:
    sched = torch.optim.lr_scheduler.StepLR(_opt(), step_size=1)
    sched.gamma = torch.tensor(0.5)  # a tensor in its state
    with pytest.raises(FSDPCommError, match="StepLR is not JSON"):
        check_scheduler(sched)
    with pytest.raises(FSDPCommError, match="step\\(\\), state_dict\\(\\) and load_state_dict"):
        check_scheduler(object())
    check_scheduler(None)
