"""The collective check (TORCHCOMM_CHECK_COLLECTIVES=1 / hint torchcomms.check_collectives):
ranks whose calls do not fit together all raise CollectiveMismatchError naming who called
what, before the engine runs the op (gloo would hang, or abort the process in C++ on a size
mismatch)."""
from __future__ import annotations

import pytest

from tests.helpers.ranks import RankGroup
from torchcomms.recovery.collective_check import SLOTS, compare, encode
from torchcomms.core.op import OpRecord
from torchcomms.core.types import OpName


def _run(case: str, world: int = 3) -> list[dict]:
    with RankGroup(world, "tests.torchcomms.workers:mismatched_calls", {"case": case}) as g:
        results = g.wait(timeout=120)
    values = []
    for res in results:
        assert res.returncode == 0 and res.value is not None, res.stderr[-3000:]
        values.append(res.value)
    return values


@pytest.mark.parametrize("case,odd,pieces", [
    ("shape", [2], ["ranks 0-1: all_reduce #2 (in float32[16]", "rank 2: all_reduce #2 (in float32[8]"]),
    ("dtype", [0], ["rank 0: all_reduce #2 (in float64[16]", "ranks 1-2: all_reduce #2 (in float32[16]"]),
    ("op", [1], ["ranks 0,2: all_reduce #2", "rank 1: broadcast #2"]),
    ("root", [0], ["ranks 1-2: broadcast #2 (in float32[16]; out float32[16]; root 0)", "rank 0: broadcast #2 (in float32[16]; out float32[16]; root 1)"]),
    ("skipped", [0], ["ranks 1-2: barrier #2", "rank 0: all_reduce #2"]),
    # before: the op ended without an error on gloo, rank 2's output partly never written
    ("splits", [], ["all_to_all_v_single #2", "the split sizes do not pair up"]),
])
def test_every_rank_names_the_call_that_does_not_fit(case: str, odd: list[int], pieces: list[str]) -> None:
    for v in _run(case):
        assert v["raised"] == "CollectiveMismatchError", v
        assert v["seq"] == 2 and v["ranks"] == odd, v
        for piece in pieces:
            assert piece in v["message"], (piece, v["message"])
        assert v["after"] == "CommAbortedError", v  # broken: later ops fail fast


def test_calls_whose_tensors_legitimately_differ_pass() -> None:
    values = _run("fits")
    for r, v in enumerate(values):
        assert v["raised"] is None, v
        assert v["all_gather_v"] == [[0.0], [1.0, 1.0], [2.0, 2.0, 2.0]]
        assert v["scatter"] == [float(r)] * 2
        assert v["all_reduce"] == [6.0] * 4
        assert v["all_to_all_v_single"] == [0.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    assert values[1]["gather"] == [[0.0] * 3, [1.0] * 3, [2.0] * 3]


def test_threads_that_share_a_communicator_pass_the_check() -> None:
    """Two threads per rank run the same all_reduces. Before, a rank's two threads reached the
    check's engine in an order of their own, so one rank's #2 met another's #3 and the very first
    op raised CollectiveMismatchError on every rank, though every call fit."""
    for v in _run("threads", world=2):
        assert v["thread_errors"] == [] and v["raised"] is None, v
        assert v["threads"] == [[2.0] * 4] * 40, v


def _rec(name: OpName, seq: int, sizes: list[list[int]], dtype: str = "float32", root: int | None = None) -> OpRecord:
    rec = OpRecord("c", (0, 1), 0, 2, "gloo", name, seq, seq, 1.0, False, 0)
    rec.input_sizes, rec.input_dtypes = sizes, [dtype] * len(sizes)
    rec.output_sizes, rec.output_dtypes = sizes, [dtype] * len(sizes)
    rec.root = root
    return rec


def test_signatures_fit_and_describe_shapes_beyond_four_dims() -> None:
    import torch

    same = torch.stack([encode(_rec(OpName.all_reduce, 3, [[2, 3]])) for _ in range(2)])
    assert same.shape == (2, SLOTS) and compare(same, "all_reduce") is None
    big = torch.stack([encode(_rec(OpName.all_reduce, 3, [[1, 2, 3, 4, 5]])),
                       encode(_rec(OpName.all_reduce, 3, [[1, 2, 3, 4, 6]]))])
    verdict = compare(big, "all_reduce")
    assert verdict is not None
    message, odd = verdict
    assert odd == [1] and "float32[1, 2, 3, 4, …]" in message


def test_v_ops_whose_ranks_list_different_sizes_do_not_fit() -> None:
    """all_gather_v and reduce_scatter_v: every rank lists every rank's size; a list that differs
    aborted a gloo rank in C++ (all_gather_v) or hung until the timeout (reduce_scatter_v)
    although the check was on."""
    import torch

    def pair(name: OpName, lists: list[list[list[int]]]) -> torch.Tensor:
        recs = []
        for rank, sizes in enumerate(lists):
            rec = _rec(name, 2, sizes)
            mine = [sizes[rank]]
            if name is OpName.all_gather_v:
                rec.input_sizes = mine
            else:
                rec.output_sizes = mine
            recs.append(encode(rec))
        return torch.stack(recs)

    fits = [[[3], [2]], [[3], [2]]]
    odd = [[[3], [2]], [[2], [2]]]
    for name in (OpName.all_gather_v, OpName.reduce_scatter_v):
        assert compare(pair(name, fits), str(name)) is None
        verdict = compare(pair(name, odd), str(name))
        assert verdict is not None and f"{name} #2" in verdict[0], (name, verdict)
