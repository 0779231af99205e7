"""Receives from any source: on gloo (bare communicator and c10d's ``recv(t)`` without ``src``
through the route, compared with c10d's own gloo), on MPI (``MPI_ANY_SOURCE``), and a typed
error on engines without them."""
from __future__ import annotations

import pytest
import torch

import torchcomms
from tests.dist.route_runs import on_and_off
from tests.dist.anysource_workers import PER_SENDER
from tests.helpers.mpi_ranks import mpi_available, run_mpi_ranks
from tests.helpers.ranks import run_ranks



def _check_senders_and_order(v: dict) -> None:
    received, sources = v["received"], v["sources"]
    # each buffer holds the message of the rank its work names, and the record names it too
    assert [m[0] for m in received] == sources == v["record_peers"]
    assert v["kinds"][1] == "2" and sources[1] == 2
    # every message arrived once, and each sender's messages in the order it sent them
    assert sorted(map(tuple, received)) == sorted((s, k) for s, m in PER_SENDER.items() for k in range(m))
    for s in PER_SENDER:
        assert [m[1] for m in received if m[0] == s] == list(range(PER_SENDER[s]))


def test_any_source_mixed_with_a_named_source_keeps_every_senders_order() -> None:
    results = run_ranks(3, "tests.dist.anysource_workers:bare_any_source", timeout=180,
                        env={"TORCHCOMM_ABORT_ON_ERROR": "0"})
    v = results[0].value
    _check_senders_and_order(v)
    kind, message = v["mismatch"]
    assert kind == "CollectiveMismatchError"
    assert "rank 1 sent 3 elements" in message and "2 elements" in message


@pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed (bash scripts/setup.sh installs both)")
def test_any_source_on_mpi_names_each_sender_and_keeps_their_order() -> None:
    (v,) = [r.value for r in run_mpi_ranks(3, "tests.dist.anysource_workers:bare_any_source", {"backend": "mpi"},
                                           timeout=180) if r.rank == 0]
    _check_senders_and_order(v)
    kind, message = v["mismatch"]  # as on gloo: the receiver names what was sent and what it posted
    assert kind == "CollectiveMismatchError"
    assert "rank 1 sent 3 elements" in message and "2 elements" in message
    (late,) = [r.value for r in run_mpi_ranks(2, "tests.dist.anysource_workers:bare_any_source_deadline",
                                              {"backend": "mpi"}, timeout=180) if r.rank == 0]
    assert late["error"] == "CommTimeoutError" and 1.5 <= late["secs"] < 1.5 + 10


def test_any_source_that_nobody_answers_ends_at_its_deadline() -> None:
    results = run_ranks(2, "tests.dist.anysource_workers:bare_any_source_deadline", timeout=180,
                        env={"TORCHCOMM_ABORT_ON_ERROR": "0"})
    v = results[0].value
    assert v["error"] == "CommTimeoutError"
    assert 1.5 <= v["secs"] < 1.5 + 10


def test_recv_without_src_through_torch_distributed_matches_c10d_gloo() -> None:
    on, off = on_and_off(3, "tests.dist.anysource_workers:c10d_any_source", timeout=120)
    assert on[0].value["backend"] == "_BackendWrapper" and off[0].value["backend"] == "ProcessGroupGloo"
    assert on[0].value["recv"] == [[1, [1.0] * 3], [2, [2.0] * 3]]
    assert on[0].value["irecv"] == [2, [20.0] * 3]
    assert {k: on[0].value[k] for k in ("recv", "irecv")} == {k: off[0].value[k] for k in ("recv", "irecv")}


def test_engine_without_any_source_raises_a_typed_error() -> None:
    c = torchcomms.new_comm("fake", "cpu", "no-any-source", hints={"rank": "0", "size": "2"})
    try:
        with pytest.raises(torchcomms.CommValueError, match="backend 'fake' cannot receive from any source"):
            c.recv_any_source(torch.empty(1), False)
        assert not c.is_broken()
    finally:
        c.finalize()


def test_source_rank_of_an_op_that_received_nothing_is_a_typed_error() -> None:
    c = torchcomms.new_comm("fake", "cpu", "source-rank-barrier", hints={"rank": "0", "size": "2"})
    try:
        work = c.barrier(False)
        with pytest.raises(torchcomms.CommValueError, match="source_rank"):
            work.source_rank()
    finally:
        c.finalize()
