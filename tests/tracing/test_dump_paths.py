"""Default dump paths are per job: two jobs that run at once on one machine, with the default
``TORCHCOMM_FR_DUMP_TEMP_FILE``, keep each its own dumps, and the viewer accepts each set.
Dumps and the viewer's outputs get the permissions the umask gives."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from tests.tracing._support import REPO, run_ranks


def _analyze(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchcomms.tracing.viewer.cli", "analyze", "--json", str(folder)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def test_concurrent_jobs_dump_to_their_own_folders(tmp_path: Path) -> None:
    results: dict[str, list[tuple[int, str]]] = {}

    def job(run_id: str) -> None:
        # the default prefix: an empty TORCHCOMM_FR_DUMP_TEMP_FILE is unset; HOME is the test's
        results[run_id] = run_ranks("clean", 2, tmp_path, extra_env={
            "TORCHCOMM_FR_DUMP_TEMP_FILE": "", "HOME": str(tmp_path), "TORCHCOMM_RUN_ID": run_id})

    threads = [threading.Thread(target=job, args=(r,)) for r in ("job-a", "job-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    root = tmp_path / ".cache" / "torch" / "comm_lib_trace"
    for run_id in ("job-a", "job-b"):
        assert [rc for rc, _ in results[run_id]] == [0, 0], results[run_id]
        folder = root / run_id
        assert sorted(p.name for p in folder.iterdir()) == ["rank_0", "rank_1"]
        out = _analyze(folder)
        assert out.returncode == 0, out.stdout + out.stderr
        report = json.loads(out.stdout)
        assert report["run_id"] == run_id and report["ranks"] == [0, 1]


def test_explicit_prefix_still_wins(tmp_path: Path, monkeypatch) -> None:
    from torchcomms.tracing import fr_format

    monkeypatch.setenv("TORCHCOMM_FR_DUMP_TEMP_FILE", str(tmp_path / "mine_"))
    assert fr_format.dump_path(3) == tmp_path / "mine_3"
    monkeypatch.delenv("TORCHCOMM_FR_DUMP_TEMP_FILE")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TORCHCOMM_RUN_ID", "a/b")
    assert fr_format.dump_path(3) == tmp_path / ".cache/torch/comm_lib_trace/a_b/rank_3"
    monkeypatch.delenv("TORCHCOMM_RUN_ID")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setenv("MASTER_PORT", "29511")
    assert fr_format.dump_path(0) == tmp_path / ".cache/torch/comm_lib_trace/local-29511/rank_0"


def test_dumps_and_viewer_outputs_follow_the_umask(tmp_path: Path, monkeypatch) -> None:
    # they were 0600 whatever the umask (tempfile.mkstemp's mode), so a dump or a timeline
    # written for others to read was not readable by them
    import os

    import torch

    import torchcomms
    from torchcomms.hooks import FlightRecorderHook
    from torchcomms.tracing.viewer.cli import run

    monkeypatch.setenv("TORCHCOMM_FR_DUMP_TEMP_FILE", str(tmp_path / "dumps" / "rank_"))
    comm = torchcomms.new_comm("fake", "cpu", "umask", hints={"rank": "0", "size": "1"})
    hook = FlightRecorderHook(max_entries=16)
    hook.register_with_comm(comm)
    comm.all_reduce(torch.ones(2), torchcomms.ReduceOp.SUM, async_op=False)
    old = os.umask(0o022)
    try:
        dump = hook.dump_file(0)
        assert dump.parent == tmp_path / "dumps"
        assert run(["export", "--perfetto", str(tmp_path / "trace.json"), str(dump)]) == 0
        os.umask(0o077)
        assert run(["view", "-o", str(tmp_path / "private.html"), str(dump)]) == 0
    finally:
        os.umask(old)
        comm.finalize()
    modes = {p.name: p.stat().st_mode & 0o777 for p in (dump, tmp_path / "trace.json", tmp_path / "private.html")}
    assert modes == {dump.name: 0o644, "trace.json": 0o644, "private.html": 0o600}
