"""Arguments an engine cannot take are refused with a typed error on real ranks of each engine
(the ``launch`` fixture: gloo, mpi), and leave the communicator working."""
from __future__ import annotations

from tests.torchcomms.conftest import Launch


def test_min_max_of_complex_tensors_are_refused_before_the_engine(launch: Launch) -> None:
    for res in launch(2, "tests.torchcomms.refusal_workers:complex_order_ops"):
        v = res.value
        sum_after = v.pop("sum_after")
        assert len(v) == 12, v
        for case, got in v.items():
            assert got.startswith("CommTypeError") and "complex" in got, (case, got)
        assert sum_after == [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]], sum_after
