"""Arguments an engine cannot take are refused with a typed error on real ranks of each engine
(the ``launch`` fixture: gloo, mpi), and leave the communicator working."""
from __future__ import annotations

from tests.torchcomms.conftest import Launch


def test_complex_min_max_and_gloo_products_are_refused_before_the_engine(launch: Launch, engine: str) -> None:
    """Also PRODUCT of complex tensors, which gloo cannot compute: it failed all_reduce and reduce
    inside c10d with a BackendError that broke the communicator, and its reduce-scatters hung until
    the timeout. gloo refuses them up front; mpi multiplies them."""
    for res in launch(2, "tests.torchcomms.refusal_workers:complex_order_ops"):
        v = res.value
        assert len(v["order"]) == 12, v
        for case, got in v["order"].items():
            assert got.startswith("CommTypeError") and "complex" in got, (case, got)
        assert len(v["product"]) == 4, v
        for case, got in v["product"].items():
            if engine == "gloo":
                assert got.startswith("CommTypeError") and "complex" in got, (case, got)
            else:
                assert got in ("correct", "returned"), (case, got)
        assert v["sum_after"] == [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]], v["sum_after"]


def test_all_to_all_whose_output_overlaps_its_input_is_refused(launch: Launch) -> None:
    """Both engines wrote over input rows not yet sent (a wrong result, no error)."""
    for res in launch(2, "tests.torchcomms.refusal_workers:all_to_all_in_place"):
        v = res.value
        after = v.pop("after")
        assert len(v) == 6, v
        for case, got in v.items():
            assert got.startswith("CommValueError") and "overlap" in got, (case, got)
        assert after == ([0.0, 1.0, 100.0, 101.0] if res.rank == 0 else [2.0, 3.0, 102.0, 103.0]), after


def test_conjugate_views_are_refused(launch: Launch) -> None:
    """A conjugate view's memory holds the unconjugated values: mpi sent those (an all_gather of
    x.conj() gathered x, no error), gloo failed inside c10d ('Invalid scalar type') and broke the
    communicator. Refused before the engine; .resolve_conj() copies of them work."""
    for res in launch(2, "tests.torchcomms.refusal_workers:conjugate_views"):
        v = res.value
        assert v.pop("resolved") == [[1.0, -2.0], [3.0, -4.0]], v
        for case, got in v.items():
            assert got.startswith("CommValueError") and "resolve_conj" in got, (case, got)
