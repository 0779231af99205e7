"""Complex tensors through every op that moves data without reducing it, on real ranks of each
engine (the ``launch`` fixture): gloo declares complex64/128, and c10d's gloo refuses them in its
gathers and all-to-alls ("Invalid scalar type"), so the engine sends their real view."""
from __future__ import annotations

import pytest

from tests.torchcomms.conftest import Launch


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_tensors_move_through_every_gather_scatter_and_all_to_all(launch: Launch, dtype: str) -> None:
    for res in launch(3, "tests.torchcomms.complex_workers:moved", {"dtype_name": dtype}):
        assert res.value == {op: True for op in res.value} and len(res.value) == 9, (res.rank, res.value)
