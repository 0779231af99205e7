"""PREMUL_SUM with each form of factor on every reducing collective, on real ranks of each engine
(the ``launch`` fixture: gloo, mpi), against a float64 reference."""
from __future__ import annotations

import pytest

from tests.torchcomms.conftest import Launch


@pytest.mark.parametrize("world", [2, 3])
def test_premul_sum_keeps_the_dtype_whatever_the_factor(world: int, launch: Launch) -> None:
    for res in launch(world, "tests.torchcomms.premul_workers:premul_sum",
                      {"dtypes": ["bfloat16", "float16", "float32", "complex64"]}, timeout=240):
        v = res.value
        assert v["wrong"] == [], (res.rank, v["wrong"][:6])
        assert v["checks"] == 4 * 3 * 5, v  # dtypes x factors x (all_reduce, reduce at its root, 3 reduce-scatters)
