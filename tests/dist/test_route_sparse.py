"""all_reduce of sparse COO tensors on the route (TORCH_DISTRIBUTED_USE_TORCHCOMMS=1): c10d's
gloo sums them, and DDP over ``nn.Embedding(sparse=True)`` relies on it; the route raised
CommTypeError ("tensor must be a dense (strided) tensor") for both."""
from __future__ import annotations

from tests.dist.route_runs import on_and_off

TARGET = "tests.dist.sparse_workers:sparse_all_reduce"


def test_sparse_all_reduce_and_ddp_with_sparse_gradients_as_on_c10ds_gloo() -> None:
    on, off = on_and_off(3, TARGET, timeout=180)
    for a, b in zip(on, off):
        assert a.value["got"] == a.value["want"], a.value
        assert b.value["got"] == b.value["want"], b.value
        assert a.value["losses"] == b.value["losses"] and a.value["weight"] == b.value["weight"]
        assert a.value["max"] == "CommValueError" and b.value["max"] == "RuntimeError"
