"""The fsdp2 example and benchmark run end to end at tiny sizes (no timing thresholds)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO, child_pythonpath
from tests.helpers.ports import free_port


def test_fsdp_bench_smoke_reports_every_contender(tmp_path: Path) -> None:
    out = tmp_path / "fsdp.json"
    env = dict(os.environ, PYTHONPATH=child_pythonpath())
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fsdp_bench.py"), "--ranks", "2", "--smoke",
                           "--no-memory", "--json", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["contender"]: r for r in json.loads(out.read_text())["rows"]}
    assert {"fsdp2", "fsdp2-no-overlap", "stock", "compute"} <= set(rows)
    assert all(r["step_ms"] > 0 for r in rows.values())
    assert rows["stock"]["throughput_vs_stock"] == 1.0
    # same weights, same data: the loss curves of fsdp2 and stock coincide
    assert rows["fsdp2"]["losses"] == rows["stock"]["losses"]
    assert "loss curves" in proc.stdout


def test_train_fsdp_example_runs_on_two_ranks() -> None:
    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, PYTHONPATH=child_pythonpath(), RANK=str(r), WORLD_SIZE="2", TORCHCOMM_RANK=str(r),
                   TORCHCOMM_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.pop("TORCHCOMM_CONTROL_ADDR", None)
        procs.append(subprocess.Popen([sys.executable, str(REPO / "examples" / "train_fsdp.py"), "--steps", "3",
                                       "--device", "cpu"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outs)
    assert "fsdp.fsdp.all_gather" in outs[0] and "step   2  loss" in outs[0] and "tokens/s" in outs[0]


def test_fsdp_bench_memory_runs_keep_every_other_option() -> None:
    # the memory runs (3 steps, no warm-up) once rewrote every option whose value equalled
    # --steps: with --steps 4 --layers 4 they measured a 3-layer model
    import importlib.util

    spec = importlib.util.spec_from_file_location("fsdp_bench", REPO / "benchmarks" / "fsdp_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = bench.build_parser().parse_args(["--steps", "4", "--layers", "4", "--heads", "4", "--prefetch", "2"])
    one = vars(args) | {"steps": 3, "warmup": 0}
    opts = bench.passthrough(type(args)(**one))
    pairs = dict(zip(opts[0:opts.index("--contenders"):2], opts[1:opts.index("--contenders"):2]))
    assert pairs["--steps"] == "3" and pairs["--warmup"] == "0"
    assert pairs["--layers"] == "4" and pairs["--heads"] == "4" and pairs["--prefetch"] == "2"
    assert bench.build_parser().parse_args(opts).layers == 4


def test_fsdp_bench_memory_only_reports_allocated_peaks_and_their_sites(tmp_path: Path) -> None:
    out = tmp_path / "mem.json"
    env = dict(os.environ, PYTHONPATH=child_pythonpath())
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fsdp_bench.py"), "--ranks", "2", "--smoke",
                           "--memory-only", "--contenders", "fsdp2", "stock", "--json", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["contender"]: r for r in json.loads(out.read_text())["rows"]}
    for r in rows.values():
        m = r["memory"]
        assert r["step_ms"] is None and r["peak_step_mem_mib"] is not None
        assert m["alloc_peak_bytes"] > m["alloc_start_bytes"] > 0  # the optimizer state, then the step's own
        assert m["alloc_end_bytes"] == m["alloc_start_bytes"] and m["alloc_sites"], m
    # Not compared with each other here: at the smoke size (dim 64, 2 layers) either peak moves by
    # one layer's gathered parameters (0.23 MiB of ~2.4) with the timing of the overlapped ops
    # (measured on the loaded VM: stock 2.40-2.63, fsdp2 2.35-2.58 MiB); the claim that fsdp2's
    # peak is at most stock's is test_fsdp2_ranks.py's, at a size where that holds.
    assert {"fsdp2", "stock"} <= set(rows)
    assert "allocated at the peak, by site" in proc.stdout


def test_elastic_example_plain_mode_runs_where_rank_0_hosts_the_store() -> None:
    # --plain took its store from torchrun's agent only: under torchcomms-run (whose workers get
    # TORCHELASTIC_USE_AGENT_STORE=False and a MASTER_PORT that rank 0 is to host) every rank
    # waited for a store nobody served until TCPStore's own 5-minute timeout (one rank shows it)
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), RANK="0", WORLD_SIZE="1", TORCHCOMM_RANK="0",
               TORCHCOMM_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               TORCHELASTIC_USE_AGENT_STORE="False")
    env.pop("TORCHCOMM_CONTROL_ADDR", None)
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "train_elastic_fsdp.py"), "--plain", "--shard", "1",
                           "--steps", "2", "--dim", "32", "--layers", "1", "--timeout", "60"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
