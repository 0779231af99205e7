"""The reference API's reconfigure path: init handles, re-forming over a subset, revoke."""
from __future__ import annotations

from tests.helpers.ranks import run_ranks


def test_reconfigure_subset_revoke_and_reform() -> None:
    res = {r.rank: r.value for r in run_ranks(3, "tests.recovery.workers:reconfigure_flow", timeout=180)}
    # configuration a: [rank 2, rank 0]
    assert res[2]["a_rank"] == 0 and res[0]["a_rank"] == 1
    assert res[0]["a_size"] == res[2]["a_size"] == 2
    assert res[0]["a_sum"] == res[2]["a_sum"] == 2.0
    assert res[0]["work_ok"] and res[0]["revoked"] and res[0]["after_revoke"] == "CommAbortedError"
    assert "does not contain this rank's handle" in res[1]["excluded_error"]
    # configuration b: everyone, reversed
    for r in range(3):
        assert res[r]["b_rank"] == 2 - r and res[r]["b_size"] == 3
        assert res[r]["b_sum"] == 6.0
