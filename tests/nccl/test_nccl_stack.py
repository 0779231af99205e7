"""The layers above the nccl backend on a GPU: fsdp2 against stock ``fully_shard`` on the
communicator's DeviceMesh, unchanged torch.distributed programs through the route
(``init_process_group("nccl")``), and the launcher's ``--nproc-per-node gpu``. One rank per GPU,
so at the GPUs present (one on the lent H200)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dist.route_runs import ROUTE, on_and_off
from tests.dist.test_route_programs import _close
from tests.helpers.ranks import run_ranks
from tests.nccl.conftest import gpus, needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mp", [False, True], ids=["fp32", "bf16-params"])
def test_fsdp2_on_nccl_trains_as_stock_fully_shard_does(mp: bool) -> None:
    res = run_ranks(gpus(), "tests.fsdp2.targets:numerics", {"steps": 6, "mp": mp, "device": "cuda"}, timeout=240)
    for r in res:
        v = r.value
        assert _close(v["ours"], v["stock"], 1e-4 if mp else 1e-5), (v["ours"], v["stock"])
        assert v["max_param_diff"] <= (1e-3 if mp else 1e-5), v["max_param_diff"]
        if gpus() > 1:  # one rank holds every shard: neither fsdp2 nor stock communicates
            assert len(v["ops"]) >= 2 and all(n > 0 for n in v["ops"].values()), v["ops"]


@pytest.mark.parametrize("program,ops", [
    ("ddp", ("all_reduce", "broadcast")),
    ("fsdp2", ("all_gather_single", "reduce_scatter_single")),
])
def test_route_programs_on_nccl_match_c10d_nccl(program: str, ops: tuple[str, ...]) -> None:
    target, kw = f"tests.dist.route_workers:{program}", {"device": "cuda"}
    on, off = on_and_off(gpus(), target, kw, timeout=240)
    for a, b in zip(on, off):
        assert _close(a.value["losses"], b.value["losses"], 1e-5), (a.value["losses"], b.value["losses"])
        assert _close(a.value["params"], b.value["params"], 1e-5)
        assert a.value["routed"] and not b.value["routed"]
        rec = a.value["recorded"]
        for op in ops if gpus() > 1 else ():  # one rank holds every shard and communicates nothing
            assert any(k.endswith(":" + op) for k in rec), f"rank {a.rank}: no {op} in {rec}"


def _names(refusals: list[str]) -> set[str]:
    return {u.split(":", 1)[0] for u in refusals}


def test_every_c10d_op_through_the_route_on_nccl_as_on_c10d_nccl() -> None:
    """``init_process_group("nccl")`` with the route on: every op gives the values computed
    locally, and the route refuses nothing that c10d's ProcessGroupNCCL accepts."""
    on, off = on_and_off(gpus(), "tests.dist.op_workers:every_op", {"device": "cuda"}, timeout=300)
    for a, b in zip(on, off):
        assert a.value["routed"] and a.value["backend"] == "_BackendWrapper" and not b.value["routed"]
        assert a.value["failures"] == [], a.value["failures"][:5]
        assert b.value["failures"] == [], b.value["failures"][:5]
        extra = _names(a.value["unsupported"]) - _names(b.value["unsupported"])
        assert not extra, [u for u in a.value["unsupported"] if u.split(":", 1)[0] in extra]
        assert a.value["checks"] >= b.value["checks"] >= 60, (a.value["checks"], b.value["checks"])
        rec = a.value["recorded"]
        for op in ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_single", "reduce_scatter",
                   "reduce_scatter_single", "all_to_all_single", "barrier"):
            assert any(k.endswith(":" + op) for k in rec), f"rank {a.rank}: no {op} in {sorted(rec)}"


@pytest.mark.parametrize("bound", [False, True], ids=["unbound", "device_id"])
def test_gloo_groups_beside_an_nccl_world_on_the_route(bound: bool) -> None:
    """``new_group(backend="gloo")`` on a world made by ``init_process_group("nccl")``: torch 2.13's
    route split the world's nccl communicator and raised ValueError ("Backend mismatch for device
    'cuda' ...") on every rank, where c10d makes a gloo group over the store (Megatron's CPU groups)."""
    n = gpus()
    res = run_ranks(n, "tests.dist.group_workers:gloo_groups_beside_nccl", {"bound": bound}, timeout=180, env=ROUTE)
    for r in res:
        v = r.value
        assert v["routed"] and v["backend"] == "gloo", v
        assert v["all_reduce"] == [n * (n + 1) / 2] * 2 and v["broadcast"] == [float(n - 1)] * 2, v
        assert v["objects"] == [{"rank": i} for i in range(n)], v
        assert v["only_0"] == (r.rank == 0) and v.get("only_0_sum", 7.0) == 7.0, v
        assert v["world"] == [float(n)] * 2, v


def test_launcher_gpu_workers_train_fsdp2_on_nccl() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "launcher", "--nproc-per-node", "gpu", "examples/train_fsdp.py", "--device", "cuda",
           "--steps", "11", "--dim", "256", "--layers", "2", "--seq", "256", "--batch", "4"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"world {gpus()} (FSDP) on cuda:0" in out, out[-4000:]
    losses = [float(m) for m in re.findall(r"step +\d+ +loss ([0-9.]+)", out)]
    assert len(losses) == 3 and losses[-1] < losses[0], out[-4000:]
