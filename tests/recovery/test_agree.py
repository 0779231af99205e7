"""``comm.agree``: survivors take the same branch after a step whose collective completed on
some members and failed on others, so parameters stay bitwise identical and step counters equal.

With the pattern without agreement (``except CommError: comm = comm.shrink()`` and redo) the
member whose op failed redoes the step while the others apply it: its parameters differ and it
waits in a shrink the others never join.
"""
from __future__ import annotations

import pytest

from tests.recovery.agreed_job import check_agreed, run_agreed_job


def test_a_step_failed_on_one_member_is_redone_by_all() -> None:
    run = run_agreed_job(3, steps=5, fail_rank=1, fail_step=2)
    check_agreed(run, 3, -1, 5)
    decisions = run["results"][0]["decisions"]
    assert decisions == [True, True, False, True, True, True], decisions  # step 2 redone once, by all
    assert all(v["shrinks"] == 1 for v in run["results"].values())


@pytest.mark.parametrize("world", [3, 4])
def test_a_kill_inside_a_step_leaves_survivors_identical(world: int) -> None:
    run = run_agreed_job(world, steps=6, victim=world - 1, kill_step=3)
    assert run["killed"] is not None, run["log"][-3000:]
    check_agreed(run, world, world - 1, 6)
