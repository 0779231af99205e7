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


def test_averaging_and_list_outputs_work_on_tensors_that_require_grad_or_are_inference_tensors(
        engine: str, launch: Launch) -> None:
    """The reducing collectives leave SUM alone on an nn.Parameter (the engine writes its memory);
    AVG's division, PREMUL_SUM's scaling and mpi's copy into list outputs are the library's own
    steps, which raised autograd's 'a leaf Variable that requires grad is being used in an
    in-place operation' after the collective and broke the communicator; on a tensor made under
    torch.inference_mode() the same steps raised 'Inplace update to inference tensor outside
    InferenceMode is not allowed'. (gloo's list all_gather
    and reduce_scatter are c10d's, whose own copies into the outputs raise the same: mpi only.)"""
    for res in launch(2, "tests.torchcomms.premul_workers:on_parameters"):
        v = res.value
        mean = 1.5  # ranks hold 1 and 2
        assert v["all_reduce AVG"] == [mean] * 4, v
        assert v["all_reduce PREMUL_SUM"] == [mean] * 4, v
        assert v["inference AVG"] == [mean] * 4, v
        assert v["inference PREMUL_SUM"] == [mean] * 4, v
        assert v["reduce AVG"] == ([mean] * 4 if res.rank == 0 else None), v
        if engine == "mpi":
            assert v["all_gather"] == [[1.0] * 4, [2.0] * 4], v
            assert v["reduce_scatter AVG"] == [mean] * 4, v
        assert v["sum_after"] == [2.0, 2.0], v
