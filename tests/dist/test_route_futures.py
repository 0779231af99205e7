"""``Work.get_future()`` on the torch.distributed route: the forwarder's completion thread
holds nothing once a future is completed, and it ends with the process group; a failed op's
future raises its typed error as often as it is asked.

It held the last completed op's callback (c10d's future and the op's output tensors) while it
waited for the next op; when the process exited, that thread let go of them during the
interpreter's finalization, on a thread the interpreter ends with ``pthread_exit``, through a
C++ destructor: "terminate called without an active exception", SIGABRT, in 3 of 15 runs of a
two-rank program of async collectives and futures."""
from __future__ import annotations

from tests.dist.route_runs import ROUTE, on_and_off
from tests.helpers.ranks import run_ranks
from tests.helpers.torch_versions import TORCH_2_13



def test_a_completed_future_leaves_nothing_behind_and_its_thread_ends() -> None:
    results = run_ranks(2, "tests.dist.future_workers:future_keeps_nothing", timeout=120, env=ROUTE)
    r0, r1 = (res.value for res in results)
    assert r0["queued"], r0  # the completion thread completed it, not the issuing call
    assert r0["value"] == 2.0 and r1["value"] == 2.0
    assert r0["tensor_released"], "the completed future's output tensor is still referenced"
    assert r0["futures_threads_left"] == [], r0


def test_a_failed_futures_typed_error_is_raised_every_time_it_is_asked_for() -> None:
    # the future held one py::error_already_set, which pybind11 restores only once: the second
    # wait() ended the process ("restore() called a second time", std::terminate)
    results = run_ranks(2, "tests.dist.future_workers:failed_future_rethrows", timeout=120, env=ROUTE)
    v = results[0].value
    assert v["seen"] == ["CommTimeoutError"] * 4, v
    assert v["then"].startswith("RuntimeError") and "CommTimeoutError" in v["then"], v
    assert v.get("exception") == ("CommTimeoutError" if TORCH_2_13 else None), v


def test_future_values_as_c10ds_gloo_gives_them() -> None:
    # all_gather_into_tensor's was [output] (ProcessGroupNCCL's value) where c10d's gloo gives the
    # output's chunks, one per rank (its _allgather_base is its allgather into output.chunk(size))
    on, off = on_and_off(2, "tests.dist.future_workers:future_values", timeout=120)
    for a, b in zip(on, off):
        assert a.value == b.value, (a.rank, a.value, b.value)
    assert on[0].value["all_gather_into_tensor"] == [[1.0, 1.0], [2.0, 2.0]] == on[0].value["result"], on[0].value
    assert on[0].value["views"] == [True, True], on[0].value
