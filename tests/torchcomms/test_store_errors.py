"""store_error: which of a store's failures become which typed error, and what they say."""
from __future__ import annotations

import torch.distributed as dist

from torchcomms.core.errors import CommAbortedError, CommTimeoutError
from torchcomms.core.store_calls import StoreNotAnswering
from torchcomms.core.error_map import engine_not_built, store_error

WHERE = {"comm": "c", "op": "shrink"}


def test_an_unanswered_call_is_a_timeout_naming_the_store_the_call_and_the_step() -> None:
    e = store_error(StoreNotAnswering("compare_set", 2.0), "the TCPStore at h:1", 2.0, WHERE,
                    step=" in the survivor agreement")
    assert isinstance(e, CommTimeoutError) and e.timeout_s == 2.0
    assert "the TCPStore at h:1 did not answer compare_set in the survivor agreement within 2 s" in str(e)
    assert "[comm 'c', shrink]" in str(e)


def test_a_lost_connection_is_an_abort_saying_the_host_is_gone() -> None:
    e = store_error(dist.DistNetworkError("Broken pipe"), "the TCPStore at h:1", 2.0, WHERE)
    assert isinstance(e, CommAbortedError) and not isinstance(e, CommTimeoutError)
    assert "the TCPStore at h:1 failed: Broken pipe (its host is gone or unreachable)" in str(e)


def test_a_lost_control_plane_is_the_error_of_any_store_failure() -> None:
    for error in (StoreNotAnswering("get", 1.0), dist.DistNetworkError("reset")):
        e = store_error(error, "the control plane", 1.0, WHERE, control_lost="the control plane is unreachable")
        assert isinstance(e, CommAbortedError) and "the control plane is unreachable" in str(e)


def test_other_errors_are_not_the_stores() -> None:
    assert store_error(RuntimeError("engine"), "s", 1.0, WHERE) is None
    assert store_error(dist.DistStoreError("timeout"), "s", 1.0, WHERE) is None


def test_an_engine_not_built_in_time_blames_a_store_only_where_there_is_one() -> None:
    """MPI has no store: its collective check's engine, not built by the op's deadline (a rank
    never came), said "a member never joined its rendezvous, or the NoneType did not answer"."""
    where = {"comm": "c", "op": "all_reduce", "seq": 2}
    without = engine_not_built("the collective check's engine", [0, 1], {}, [0, 1], None, 2.0, where)
    assert isinstance(without, CommTimeoutError)
    assert str(without) == ("[comm 'c', all_reduce #2] the collective check's engine was not ready within 2 s "
                            "(a member never joined its rendezvous)")
    store = dist.HashStore()
    with_store = engine_not_built("the collective check's engine", [0, 1], {}, [0, 1], store, 2.0, where)
    assert str(with_store).endswith("(a member never joined its rendezvous, or the HashStore did not answer)")
