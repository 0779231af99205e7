"""comm_bench's MPI engine runs end to end at tiny sizes and writes complete JSON (no timing
thresholds: every contender measured, ratios present, goal lines printed)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.test_bench_smoke import run_script
from tests.helpers.mpi_ranks import mpi_available

pytestmark = pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")


def test_comm_bench_mpi_engine_measures_every_contender(tmp_path: Path) -> None:
    out = tmp_path / "cb.json"
    proc = run_script("comm_bench", "--engine", "mpi", "--ops", "all_reduce,all_gather_single", "--min-bytes", "1K",
                      "--max-bytes", "4K", "--iters", "2", "--warmup", "0", "--json", str(out), timeout=240)
    data = json.loads(out.read_text())
    assert data["meta"]["engine"] == "mpi"
    rows = data["results"]
    assert [(r["op"], r["bytes"]) for r in rows] == [("all_reduce", 1024), ("all_reduce", 4096),
                                                     ("all_gather_single", 1024), ("all_gather_single", 4096)]
    for r in rows:
        assert "error" not in r, r
        assert set(r["contenders"]) == {"torchcomms", "mpi4py", "c10d"}
        for c in r["contenders"].values():
            assert c["time_us"] > 0 and len(c["samples_us"]) == 2
        assert r["contenders"]["torchcomms"]["pair_bare"] > 0
    assert "goal: latency at 1 KiB" in proc.stdout
