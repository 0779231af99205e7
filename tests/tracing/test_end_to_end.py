"""Real multi-process gloo jobs: a rank that skips a collective, a size mismatch; PyTorch's
own fr_trace analyzer reads our dumps, and ours reads PyTorch's."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tracing._support import REPO, Rec, run_ranks, write_job

FR_TRACE = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]


def _trace_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchcomms.tracing.viewer.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def pytorch_fr_trace_reads_gloo() -> bool:
    """Whether this torch's fr_trace accepts gloo entries (torch 2.11's reads only nccl/xccl
    dumps: "name formatting error? gloo != 'nccl' or 'xccl'", for PyTorch's own gloo too)."""
    from torch.distributed.flight_recorder.components.types import Op

    try:
        Op({"profiling_name": "gloo:all_reduce"}, {}, "")
    except AssertionError as e:
        return "name formatting" not in str(e)
    except Exception:  # noqa: BLE001 - past the backend check, on the missing fields
        return True
    return True


def _fr_trace(dump_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """PyTorch's analyzer on ``dump_dir``; skips the rest of the test (ours has run by then)
    where this torch's analyzer cannot read gloo dumps at all."""
    if not pytorch_fr_trace_reads_gloo():
        import torch

        pytest.skip(f"torch {torch.__version__}'s fr_trace reads only nccl/xccl dumps, not gloo ones")
    return subprocess.run([*FR_TRACE, str(dump_dir), *extra], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_rank_that_skips_a_collective_is_named(tmp_path: Path) -> None:
    results = run_ranks("skip_collective", 3, tmp_path)
    assert [rc for rc, _ in results] == [3, 3, 0], [e[-2000:] for _, e in results]
    assert "CommTimeoutError" in results[0][1] and "all_reduce #3" in results[0][1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fr_rank_0", "fr_rank_1", "fr_rank_2"]
    for r in (0, 1):
        with open(tmp_path / f"fr_rank_{r}", "rb") as f:
            assert pickle.load(f)["torchcomms"]["reason"].startswith("timed_out:dp:all_reduce#3")
    res = _trace_cli("analyze", "--json", str(tmp_path))
    assert res.returncode == 1, res.stderr
    report = json.loads(res.stdout)
    (f,) = [f for f in report["findings"] if f["kind"] == "missing_rank"]
    assert (f["ranks"], f["op"], f["seq"], f["comm"]) == ([2], "all_reduce", 3, "dp")
    assert "rank 2 never entered all_reduce #3 on comm 'dp'; ranks 0-1 waiting since" in f["message"]
    text = _trace_cli("analyze", str(tmp_path))
    assert text.returncode == 1 and "rank 2 never entered all_reduce #3" in text.stdout
    assert "workers.py" in text.stdout  # the call site of the waiting ranks
    # PyTorch's own analyzer reads the same dumps without error.
    fr = _fr_trace(tmp_path)
    assert fr.returncode == 0, fr.stderr[-3000:]
    assert "Traceback" not in fr.stderr
    assert "missing ranks: {2}" in fr.stdout + fr.stderr


def test_op_that_timed_out_while_gloo_still_blocks_in_it_is_dumped_as_started(tmp_path: Path) -> None:
    """Rank 0's all_reduce #2 times out while gloo still blocks in it (rank 1 never entered):
    its dump says the op is started and still in the engine, with the caller's timeout beside
    it, not that it failed; once an abort makes gloo return, the dump says it timed out. The
    dumps used to say "timed_out" (retired) while the engine was still inside the op."""
    results = run_ranks("timeout_then_abort", 2, tmp_path)
    assert [rc for rc, _ in results] == [3, 0], [e[-2000:] for _, e in results]
    assert "CommTimeoutError" in results[0][1]

    def op2(name: str) -> tuple[dict, dict]:
        with open(tmp_path / name, "rb") as f:
            d = pickle.load(f)
        (e,) = [e for e in d["entries"] if e["collective_seq_id"] == 2 and e["profiling_name"] == "gloo:all_reduce"]
        return e, d["torchcomms"]["ops"][str(e["record_id"])]

    e, x = op2("fr_rank_blocked_0")
    assert (e["state"], e["retired"], e["time_discovered_completed_ns"]) == ("started", False, None)
    assert (x["state"], x["outcome"], x["in_engine"]) == ("started", "timed_out", True)
    assert "did not complete within" in x["error"]
    e, x = op2("fr_rank_aborted_0")
    assert (e["state"], e["retired"]) == ("started", True)  # PyTorch's format has no failed state
    assert (x["state"], x["outcome"], x["in_engine"]) == ("timed_out", None, False)
    # The viewer reads the first dump as the dump says: in flight, not failed.
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "fr_rank_0").write_bytes((tmp_path / "fr_rank_blocked_0").read_bytes())
    res = _trace_cli("analyze", "--json", str(blocked))
    report = json.loads(res.stdout)
    assert not [f for f in report["findings"] if f["kind"] == "failed"], report["findings"]
    calls = [c for f in report["findings"] for c in f["calls"].values() if c.startswith("all_reduce")]
    assert any("started, still in the engine after the caller got timed_out" in c for c in calls), report


def test_size_mismatch_report_shows_both_ranks_calls(tmp_path: Path) -> None:
    results = run_ranks("size_mismatch", 2, tmp_path)
    assert all(rc == 0 for rc, _ in results), [e[-2000:] for _, e in results]
    res = _trace_cli("analyze", "--json", str(tmp_path))
    assert res.returncode == 1, res.stderr
    (f,) = [f for f in json.loads(res.stdout)["findings"] if f["kind"] == "mismatch"]
    assert f["op"] == "all_reduce" and f["seq"] == 2
    assert "input sizes differ: rank 0 [[64]], rank 1 [[8, 8]]" in f["message"]
    assert "in=[[64]]" in f["calls"]["0"] and "in=[[8, 8]]" in f["calls"]["1"]
    text = _trace_cli("analyze", str(tmp_path))
    assert "in=[[64]]" in text.stdout and "in=[[8, 8]]" in text.stdout
    fr = _fr_trace(tmp_path)
    assert fr.returncode == 0 and "Traceback" not in fr.stderr, fr.stderr[-3000:]


def test_byte_mismatch_under_the_collective_check_leaves_every_ranks_dump(tmp_path: Path) -> None:
    """Sizes whose byte counts differ kill gloo's receiving rank in C++ (no dump from it);
    with TORCHCOMM_CHECK_COLLECTIVES=1 both ranks raise CollectiveMismatchError and dump, and
    the analyzer shows both calls."""
    results = run_ranks("byte_mismatch", 2, tmp_path, extra_env={"TORCHCOMM_CHECK_COLLECTIVES": "1"})
    assert [rc for rc, _ in results] == [3, 3], [e[-2000:] for _, e in results]
    for _, err in results:
        assert "CollectiveMismatchError" in err and "all_reduce #2" in err, err[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fr_rank_0", "fr_rank_1"]
    res = _trace_cli("analyze", "--json", str(tmp_path))
    assert res.returncode == 1, res.stderr
    (f,) = [f for f in json.loads(res.stdout)["findings"] if f["kind"] == "mismatch"]
    assert f["op"] == "all_reduce" and f["seq"] == 2
    assert "in=[[64]]" in f["calls"]["0"] and "in=[[32]]" in f["calls"]["1"]


def test_pytorch_analyzer_reads_every_op_kind_we_write(tmp_path: Path) -> None:
    ranks = (0, 1)
    per_rank = {}
    for r in ranks:
        per_rank[r] = [
            Rec("dp", ranks, r, "all_reduce", 1).complete(),
            Rec("dp", ranks, r, "send" if r == 0 else "recv", 1, is_p2p=True, peer=1 - r).complete(),
            Rec("dp", ranks, r, "recv" if r == 0 else "send", 2, is_p2p=True, peer=1 - r).complete(),
            Rec("dp", ranks, r, "batch_p2p", 3, is_p2p=True, sizes=[]).complete(),
            Rec("dp", ranks, r, "split", 2, sizes=[[3]]).complete(),
            Rec("dp", ranks, r, "shrink", 3, sizes=[]).complete(),
            Rec("dp", ranks, r, "all_to_all_v_single", 4, sizes=[[r + 1]]).complete(),
            Rec("tp", ranks, r, "all_gather_single", 1, sizes=[[8]]).start(),
        ]
    write_job(tmp_path / "coll", per_rank)
    fr = _fr_trace(tmp_path / "coll")
    assert fr.returncode == 0 and "Traceback" not in fr.stderr, fr.stderr[-3000:]
    assert _trace_cli("analyze", str(tmp_path / "coll")).returncode == 1  # tp all_gather still running
    # Point-to-point alone on its own comm.
    p2p = {
        r: [
            Rec("pp", ranks, r, "send" if r == 0 else "recv", 1, is_p2p=True, peer=1 - r).complete(),
            Rec("pp", ranks, r, "recv" if r == 0 else "send", 2, is_p2p=True, peer=1 - r).complete(),
        ]
        for r in ranks
    }
    write_job(tmp_path / "p2p", p2p)
    fr = _fr_trace(tmp_path / "p2p")
    assert fr.returncode == 0 and "Traceback" not in fr.stderr, fr.stderr[-3000:]
    assert _trace_cli("analyze", str(tmp_path / "p2p")).returncode == 0


def test_we_read_a_real_pytorch_dump(tmp_path: Path) -> None:
    script = (
        "import pickle, sys, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "t = torch.ones(8)\n"
        "for _ in range(3): dist.all_reduce(t)\n"
        "dist.barrier()\n"
        "open(sys.argv[1], 'wb').write(torch._C._distributed_c10d._dump_fr_trace())\n"
        "dist.destroy_process_group()\n"
    )
    out = tmp_path / "pt_trace_0"
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="64")
    subprocess.run([sys.executable, "-c", script, str(out)], check=True, env=env, timeout=120, capture_output=True)
    res = _trace_cli("analyze", "--json", str(out))
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert rep["op_count"] == 4 and rep["collective_count"] == 4 and list(rep["comms"]) == ["0"]
    assert any("never left 'scheduled'" in n for n in rep["notes"])
    assert _trace_cli("export", str(out), "--perfetto", str(tmp_path / "p.json")).returncode == 0
