"""The multi-process test runner: a rank that outlives its timeout is reported with every
rank's state and the hung rank's stacks (before, the report named only the rank)."""
from __future__ import annotations

import time

import pytest

from tests.helpers.ranks import run_ranks


def test_a_hung_rank_is_reported_with_its_stack_and_the_other_ranks_state():
    with pytest.raises(AssertionError) as info:
        run_ranks(2, "tests.helpers.sleepers:rank0_returns_others_block", timeout=3)
    report = str(info.value)
    assert "rank 1 did not finish within 3 s" in report
    assert "--- rank 0: exited rc=0" in report
    assert "--- rank 1: still running" in report
    assert "_blocked_forever" in report  # the hung rank's stack, dumped before it was killed


def test_a_failed_rank_is_named_first_and_its_waiting_peers_are_not_waited_on_for_long():
    # A rank blocked on a failed peer used to be waited on for the whole timeout, and the report
    # then named the waiting rank ("rank 1 did not finish within 180 s"), not the one that failed.
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as info:
        run_ranks(2, "tests.helpers.sleepers:rank0_raises_others_block", timeout=120, failed_grace=2)
    assert time.monotonic() - t0 < 60
    report = str(info.value)
    assert report.startswith("rank 0 failed (rc=1: RuntimeError: rank 0 gave up); rank(s) 1 had not finished 2 s later")
    assert "--- rank 1: still running" in report
    assert "_blocked_forever" in report


def test_ranks_keep_the_parents_python_path(tmp_path, monkeypatch):
    # The runner used to set PYTHONPATH to the repository alone, so every rank on the GPU
    # machine, whose dependencies sit on PYTHONPATH (carried wheels), failed to import them.
    (tmp_path / "tc_only_on_parent_path.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    results = run_ranks(2, "tests.helpers.sleepers:imports_from_pythonpath",
                        {"module": "tc_only_on_parent_path"}, timeout=60)
    assert [r.value for r in results] == [str(tmp_path / "tc_only_on_parent_path.py")] * 2
