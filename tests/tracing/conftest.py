"""Fixtures for the tracing tests (helpers live in _support.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from torchcomms.tracing.flight_recorder import process_recorder


@pytest.fixture
def job_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("TORCHCOMM_RUN_ID", "job-1")
    monkeypatch.setenv("TORCHCOMM_FR_DUMP_TEMP_FILE", str(tmp_path / "dumps" / "fr_rank_"))
    # The process recorder learns its global rank from the first communicator it sees; a test
    # that ran earlier in this worker (a fake comm at rank 3, say) must not pick the dump's name.
    recorder = process_recorder()
    monkeypatch.setattr(recorder, "global_rank", None)
    monkeypatch.setattr(recorder, "world_size", None)
    return tmp_path / "dumps"
