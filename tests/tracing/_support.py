"""Helpers for the tracing tests: synthetic op records and a real multi-rank job runner."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.helpers.paths import REPO, child_pythonpath
from tests.helpers.ports import free_port


def run_ranks(scenario: str, n: int, dump_dir: Path, *, extra_env: dict[str, str] | None = None, limit_s: float = 90) -> list[tuple[int, str]]:
    """Run ``tests.tracing.workers <scenario>`` as ``n`` real rank processes; return
    (returncode, stderr) per rank. Every process is reaped before returning."""
    port = free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ)
        env.update(
            TORCHCOMM_RANK=str(r), TORCHCOMM_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
            PYTHONPATH=child_pythonpath(), TORCHCOMM_FR_DUMP_TEMP_FILE=str(dump_dir / "fr_rank_"),
            TORCHCOMM_FR_DUMP_ON_EXIT="1", TORCHCOMM_RUN_ID="trace-test", TORCHCOMM_LOG_FORMAT="json",
        )
        env.pop("TORCHCOMM_CONTROL_ADDR", None)
        env.update(extra_env or {})
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.tracing.workers", scenario], cwd=REPO, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        ))
    deadline = time.monotonic() + limit_s
    out = []
    try:
        for p in procs:
            left = max(1.0, deadline - time.monotonic())
            try:
                _, err = p.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            out.append((p.returncode, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


class Rec:
    """A stand-in ``OpRecord`` (same fields) for feeding the recorder without a comm."""

    def __init__(self, comm: str, ranks: tuple[int, ...], rank: int, name: str, seq: int, *, op_id: int = 0,
                 sizes: list[list[int]] | None = None, dtype: str = "float32", is_p2p: bool = False,
                 peer: int | None = None, root: int | None = None, backend: str = "gloo",
                 t0: int | None = None, timeout_s: float = 30.0) -> None:
        self.comm_name, self.comm_ranks, self.rank, self.size = comm, ranks, rank, len(ranks)
        self.backend, self.name, self.seq, self.op_id = backend, name, seq, op_id
        self.is_p2p, self.peer, self.root, self.reduce_op = is_p2p, peer, root, "SUM" if name == "all_reduce" else None
        sizes = sizes if sizes is not None else [[1024]]
        self.input_sizes, self.output_sizes = sizes, [list(s) for s in sizes]
        self.input_dtypes = self.output_dtypes = [dtype] * len(sizes)
        self.timeout_s, self.async_op = timeout_s, False
        self.time_created_ns = t0 if t0 is not None else time.time_ns()
        self.time_started_ns: int | None = None
        self.time_completed_ns: int | None = None
        self.state, self.error, self.hints, self.extra = "scheduled", None, None, None

    @property
    def duration_ms(self) -> float | None:
        if self.time_completed_ns is None or self.time_started_ns is None:
            return None
        return (self.time_completed_ns - self.time_started_ns) / 1e6

    def start(self, dt_ns: int = 1000) -> "Rec":
        self.state, self.time_started_ns = "started", self.time_created_ns + dt_ns
        return self

    def complete(self, dur_ns: int = 1_000_000) -> "Rec":
        if self.time_started_ns is None:
            self.start()
        assert self.time_started_ns is not None
        self.state, self.time_completed_ns = "completed", self.time_started_ns + dur_ns
        return self


def feed(recorder: Any, recs: list[Rec]) -> None:
    for i, r in enumerate(recs):
        recorder.pre_hook(r.name, i, r)
        if r.state != "scheduled":
            recorder.post_hook(i, r)




def write_job(dump_dir: Path, per_rank: dict[int, list[Rec]], *, run_id: str = "job-1",
              dumped_at_ns: int | None = None) -> list[Path]:
    """Feed each rank's records to its own recorder and write its dump file; return paths.
    ``dumped_at_ns``: the dumps' time (default: when written, which a loaded host can put
    seconds after records made "a few ms ago")."""
    import contextlib
    from unittest import mock

    from torchcomms.tracing import fr_format
    from torchcomms.tracing.flight_recorder import FlightRecorder

    old = os.environ.get("TORCHCOMM_RUN_ID")
    os.environ["TORCHCOMM_RUN_ID"] = run_id
    try:
        paths = []
        for rank, recs in per_rank.items():
            fr = FlightRecorder(2048, stack_depth=1)
            feed(fr, recs)
            at = (mock.patch.object(fr_format.time, "time_ns", return_value=dumped_at_ns)
                  if dumped_at_ns is not None else contextlib.nullcontext())
            with at:
                paths.append(fr.dump_file(rank, prefix=str(dump_dir / "fr_rank_")))
        return paths
    finally:
        if old is None:
            os.environ.pop("TORCHCOMM_RUN_ID", None)
        else:
            os.environ["TORCHCOMM_RUN_ID"] = old
