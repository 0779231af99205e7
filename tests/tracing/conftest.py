"""Fixtures for the tracing tests (helpers live in _support.py)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def job_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("TORCHCOMM_RUN_ID", "job-1")
    monkeypatch.setenv("TORCHCOMM_FR_DUMP_TEMP_FILE", str(tmp_path / "dumps" / "fr_rank_"))
    return tmp_path / "dumps"
