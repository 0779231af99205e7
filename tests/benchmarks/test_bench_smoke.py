"""The communication benchmarks run end to end at tiny sizes and write complete JSON.

No timing thresholds: these check that every op and size was measured (positive times, ratios
present) and that bad command lines are refused with a message naming the culprit.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.paths import REPO, child_pythonpath
BENCH = REPO / "benchmarks"
OPS = ("all_reduce", "all_gather_single", "reduce_scatter_single", "all_to_all_single", "broadcast")


def load(name: str) -> ModuleType:
    """A script of ``benchmarks/`` by its path below it (``"attn_bench"``, ``"diagnostics/window_tune"``)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name.replace('/', '_')}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def run_script(name: str, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), TORCHCOMM_LOG_EVENTS="0")
    env.pop("TORCHCOMM_TRACING_DISABLE", None)
    proc = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.timeout(200)
def test_comm_bench_measures_every_op_and_size(tmp_path: Path) -> None:
    out = tmp_path / "comm.json"
    proc = run_script("comm_bench", "--min-bytes", "4K", "--max-bytes", "8K", "--step-factor", "2",
                      "--iters", "2", "--warmup", "1", "--tracing", "both", "--control", "--engines", "2",
                      "--json", str(out))
    data = json.loads(out.read_text())
    assert data["meta"]["nproc"] == 2 and data["meta"]["tracing"] == "both"
    assert data["meta"]["engines_per_contender"] == 2
    failed = [f"{r['op']} {r['bytes']}: {r['error']}" for r in data["results"] if "error" in r]
    assert not failed, f"ops failed in the benchmark: {failed}"
    seen = {(r["op"], r["bytes"]) for r in data["results"]}
    assert seen == {(op, b) for op in OPS for b in (4096, 8192)}
    for r in data["results"]:
        assert set(r["contenders"]) == {"torchcomms", "torchcomms-notrace", "c10d-again", "c10d"}
        for name, c in r["contenders"].items():
            assert c["time_us"] > 0 and len(c["samples_us"]) == 2, (r["op"], name)
            assert c["algbw_GBps"] == pytest.approx(r["bytes"] / c["time_us"] / 1e3)
            if name != "c10d":
                assert c["ratio"] == pytest.approx(c["time_us"] / r["contenders"]["c10d"]["time_us"])
    assert "| all_reduce | 4 KiB |" in proc.stdout


@pytest.mark.timeout(120)
def test_dispatch_bench_measures_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "dispatch.json"
    run_script("dispatch_bench", "--rounds", "2", "--ops", "20", "--profile", "5", "--profile-calls", "50",
               "--json", str(out))
    data = json.loads(out.read_text())
    names = {r["contender"] for r in data["results"]}
    assert {"floor", "sync, no tracing", "sync, tracing", "async+wait, no tracing", "async+wait, tracing"} <= names
    for r in data["results"]:
        assert r["us_per_op"] > 0 and len(data["samples_us"][r["contender"]]) == 2
    assert set(data["profiles"]) == {"sync, no tracing", "sync, tracing", "async+wait, tracing"}
    assert all(0 < len(rows) <= 5 for rows in data["profiles"].values())


def test_busbw_factors_follow_nccl_tests() -> None:
    cb = load("comm_bench")
    assert cb.busbw_factor("all_reduce", 2) == 1.0
    assert cb.busbw_factor("all_reduce", 4) == 1.5
    for op in ("all_gather_single", "reduce_scatter_single", "all_to_all_single"):
        assert cb.busbw_factor(op, 4) == 0.75
    assert cb.busbw_factor("broadcast", 8) == 1.0


def test_sizes_and_buffers() -> None:
    cb = load("comm_bench")
    assert cb.parse_bytes("4K") == 4096 and cb.parse_bytes("64MiB") == 64 << 20 and cb.parse_bytes("123") == 123
    assert cb.size_sweep(4096, 64 << 20, 4) == [4096 << (2 * k) for k in range(8)]
    import torch

    b, nbytes = cb.make_buffers("all_gather_single", 4096, 3, 0, torch.float32)
    assert b.out.numel() == 3 * b.inp.numel() and nbytes == b.out.numel() * 4 <= 4096
    b, _ = cb.make_buffers("reduce_scatter_single", 4096, 2, 0, torch.float32)
    assert b.inp.numel() == 1024 and b.out.numel() == 512


@pytest.mark.parametrize(
    ("argv", "culprit"),
    [
        (["--ops", "all_reduce,nope"], "nope"),
        (["--min-bytes", "1M", "--max-bytes", "4K"], "--min-bytes"),
        (["--max-bytes", "lots"], "lots"),
        (["--nproc", "1"], "--nproc"),
        (["--iters", "0"], "--iters"),
        (["--engines", "0"], "--engines"),
    ],
)
def test_comm_bench_refuses_bad_arguments(argv: list[str], culprit: str, capsys: pytest.CaptureFixture[str]) -> None:
    cb = load("comm_bench")
    with pytest.raises(SystemExit) as exc:
        cb.main(argv)
    assert exc.value.code == 2
    assert culprit in capsys.readouterr().err


def test_dispatch_bench_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    db = load("dispatch_bench")
    with pytest.raises(SystemExit) as exc:
        db.main(["--rounds", "0"])
    assert exc.value.code == 2
    assert "--rounds" in capsys.readouterr().err


def test_host_sampler_finds_where_the_time_goes() -> None:
    import time

    sampler = load("diagnostics/host_sampler")

    def busy_here() -> None:  # pure Python: the sampler gets the GIL between its bytecodes
        t = time.perf_counter()
        while time.perf_counter() - t < 2e-3:
            pass

    def quick() -> None:
        sum(range(10))

    def workload() -> None:
        quick()
        busy_here()

    got = sampler.sample(workload, calls=100)
    assert got.rounds > 50
    # other threads (pytest-xdist's gateway reader, say) are sampled too: look at the caller's
    top_where, top_n = max(((w, n) for w, n in got.innermost.items() if w.startswith("[caller]")),
                           key=lambda item: item[1])
    assert "busy_here" in top_where, got.table()
    assert top_n / got.rounds > 0.5, got.table()
    # the innermost frame inside the repository: this test file's function
    assert "busy_here" in max(got.ours.items(), key=lambda item: item[1])[0], got.table()


def test_window_tune_keeps_the_shipped_kernel_forms_in_its_tuned_configuration() -> None:
    """The tuned configuration takes only the searched shapes and keeps every other field of the
    shipped one (the dK/dV tiles' orientation), so its whole-pass rows time the shapes in the
    form they were searched in (dropping the orientation timed the untransposed dK/dV kernel
    against the shipped transposed one on an H200: 2.191 vs 2.088 ms)."""
    tune = load("diagnostics/window_tune")
    wt = tune.wt
    shipped = wt.WindowConfig(wt.Blocks(64, 64, 4, 3, tma=True), wt.Blocks(64, 64, 4, 2, tma=True),
                              wt.Blocks(64, 64, 4, 2, tma=True), wt.Blocks(64, 64, 4, 4, tma=True),
                              dkdv_transposed=True)
    rows = [{"kernel": "fwd", "ms": 0.4, "cfg": wt.Blocks(64, 32, 4, 2).__dict__},
            {"kernel": "fwd", "ms": 0.5, "cfg": wt.Blocks(64, 64, 4, 3).__dict__},
            {"kernel": "dq", "error": "out of shared memory", "cfg": wt.Blocks(128, 64, 8, 2).__dict__}]
    tuned = tune.tuned_config(shipped, rows, wt.Blocks(32, 64, 4, 2), None)
    assert tuned.fwd == wt.Blocks(64, 32, 4, 2)  # the fastest timed shape
    assert tuned.dq == shipped.dq  # no shape timed: the shipped one
    assert (tuned.dkdv, tuned.dq_from_ds) == (wt.Blocks(32, 64, 4, 2), None)
    assert tuned.dkdv_transposed


def test_custom_op_overhead_prints_both_paths_and_their_ratio() -> None:
    out = run_script("diagnostics/custom_op_overhead", "--reps", "50", "--rounds", "2").stdout
    rows = {line.split("  ")[0].strip(): line.split()[-2:] for line in out.splitlines()[2:5]}
    assert set(rows) == {"autograd.Function", "custom operator", "ratio op/Function"}, out
    for name in ("autograd.Function", "custom operator"):
        assert all(float(v) > 0 for v in rows[name]), out


def test_window_forward_gaps_summarises_kernel_spans_and_refuses_without_a_gpu() -> None:
    gaps = load("diagnostics/window_forward_gaps")
    # three kernels of 10 us: idle 1 us, then 2 us between them
    assert gaps.summary([(0.0, 10.0), (11.0, 10.0), (23.0, 10.0)]) == (10.0, 1.5, 3)
    assert gaps.summary([(5.0, 7.0)]) == (7.0, 0.0, 1)
    if not gaps.torch.cuda.is_available():
        proc = subprocess.run([sys.executable, str(BENCH / "diagnostics" / "window_forward_gaps.py")], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


def test_queued_timing_opens_each_region_behind_a_call_already_issued(monkeypatch: pytest.MonkeyPatch) -> None:
    """A queued region must not start with the GPU idle, waiting for the host to launch its
    first call: one call is issued ahead of each region. Single-call timing keeps the launch."""
    bench = load("attn_bench")
    log: list[str] = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self) -> None:
            log.append("r")

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, other: "Event") -> float:
            return 1.0

    monkeypatch.setattr(bench.torch.cuda, "Event", Event)
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)
    # 1 ms per call estimated: 4 calls per 4 ms region, 3 regions; the estimate's own region first
    bench.time_ms(lambda: log.append("c"), warmup=0, min_reps=3, target_ms=3.0, queued_ms=4.0)
    assert "".join(log) == "rcr" + "c" + "rccccr" + "c" + "rccccr" + "c" + "rccccr"
    log.clear()
    bench.time_ms(lambda: log.append("c"), warmup=0, min_reps=2, target_ms=1.0)
    assert "".join(log) == "rcr" + "rcr" * 2


@pytest.mark.timeout(200)
def test_nccl_host_path_breakdown_runs_on_the_stand_in_engine(tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    run_script("diagnostics/nccl_host_path", "--device", "cpu", "--rounds", "2", "--burst", "5", "--json", str(out))
    summary = json.loads(out.read_text())["summary"]
    assert set(summary) == {"engine call alone (stand-in: no work)", "ours sync, untraced", "ours async+wait, untraced",
                            "ours sync, traced", "ours async+wait, traced", "ours sync, traced, no timing"}
    assert all(row["cpu_us"] >= 0 and row["wall_us"] > 0 for row in summary.values())


@pytest.mark.parametrize("clients", ["poll", "threads"])
def test_scale_bench_fanout_reaches_every_simulated_rank(tmp_path: Path, clients: str) -> None:
    out = tmp_path / "scale.json"
    run_script("scale_bench", "--ranks", "64", "--kinds", "ours", "--phases", "fanout", "--procs", "2",
               "--fanout-clients", clients, "--json", str(out), timeout=240)
    (result,) = json.loads(out.read_text())["results"]
    assert result["ranks"] == 64 and result["kind"] == "ours"
    assert result["fanout_s"] > 0 and result["fanout_cpu_s"] >= 0


def test_elastic_bench_counts_the_survivors_passes_after_the_kill_as_work_not_stop() -> None:
    """Ranks 0, 1 survive (replica 0), rank 3 is killed at t=100 in step 2: the survivors' own
    pass ran 99.5-101, the make-up pass 101.5-103, the step completed at 103.25."""
    bench = load("elastic_bench")
    recs = {0: [{"step": 0, "time": 96.0}, {"step": 1, "time": 99.4},
                {"step": 2, "time": 103.25, "recovery_s": 0.3, "passes": [[99.5, 101.0], [101.5, 103.0]]}],
            3: [{"killed": 100.0, "at_step": 2}]}
    got = bench.measure(recs, victim=3, shard=2, fail_step=2, heal=False)
    assert got["stall_s"] == pytest.approx(3.25)
    assert got["stopped_s"] == pytest.approx(0.75)  # 101-101.5 and 103-103.25
    assert got["step_s"] == pytest.approx(3.4)
    # torchrun: its restarted job (attempt 1) begins step 0 at 104 and completes it at 107
    anchor = {0: [{"step": 0, "time": 96.0, "attempt": 0}, {"step": 1, "time": 99.4, "attempt": 0},
                  {"step": 0, "time": 107.0, "attempt": 1, "passes": [[104.0, 107.0]]}],
              3: [{"killed": 100.0, "at_step": 2}]}
    got = bench.measure(anchor, victim=3, shard=2, fail_step=2, heal=False)
    assert (got["stall_s"], got["stopped_s"]) == (pytest.approx(7.0), pytest.approx(4.0))


def test_first_comm_bench_times_both_contenders_and_their_ratio(tmp_path: Path) -> None:
    out = tmp_path / "first.json"
    proc = run_script("first_comm_bench", "--rounds", "1", "--json", str(out))
    data = json.loads(out.read_text())
    assert set(data["median_s"]) == {"torchcomms", "c10d"}
    assert all(wall > 0 and cpu > 0 for wall, cpu in data["median_s"].values())
    ours, anchor = data["median_s"]["torchcomms"], data["median_s"]["c10d"]
    assert data["ratio_cpu"] == pytest.approx(ours[1] / anchor[1])
    assert "torchcomms / c10d: CPU" in proc.stdout


def test_first_comm_bench_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        load("first_comm_bench").main(["--rounds", "0"])
    assert exc.value.code == 2
    assert "--rounds" in capsys.readouterr().err
