"""DDP's options and communication hooks on our communicators (TORCH_DISTRIBUTED_USE_TORCHCOMMS=1):
the same losses and parameters as on c10d's gloo.

PowerSGD's hook all-reduces inside a future's ``then`` callback and waits there for that
all-reduce's future; the route completed futures on one thread per communicator, the one running
the callback, so training hung at the hook's first compressed step (c10d's gloo completes futures
on its worker threads)."""
from __future__ import annotations

from tests.dist.route_runs import ROUTE, on_and_off
from tests.dist.test_route_programs import _close

VARIANTS = ("unused", "no_sync", "static_graph", "small_buckets", "allreduce_hook", "fp16_hook", "powersgd", "join")


def test_ddp_variants_same_numbers_as_c10d() -> None:
    on, off = on_and_off(2, "tests.dist.ddp_workers:variants", timeout=120)
    for a, b in zip(on, off):
        for name in VARIANTS:
            assert _close(a.value[name]["losses"], b.value[name]["losses"], 1e-5), (name, a.value[name]["losses"])
            assert _close(a.value[name]["params"], b.value[name]["params"], 1e-5), name
        assert any(k.endswith(":all_reduce") for k in a.value["recorded"]), a.value["recorded"]
        assert b.value["recorded"] == {}
    for name in VARIANTS:  # DDP kept the ranks' parameters in step
        assert on[0].value[name]["params"] == on[1].value[name]["params"], name


def test_a_peer_killed_mid_training_raises_our_typed_error_from_backward() -> None:
    # the failed all-reduce's error reached backward() as a RuntimeError("PeerFailureError: ..."):
    # the future held it as an exception torch's bindings turn into RuntimeError
    from tests.helpers.ranks import RankGroup

    env = dict(ROUTE, TORCHCOMM_TIMEOUT_SECONDS="60")
    with RankGroup(3, "tests.dist.ddp_workers:peer_killed_before_backward", {"victim": 1}, env=env) as g:
        results = g.wait(120, failed_grace=60)
    assert results[1].returncode == -9
    for res in (results[0], results[2]):
        v = res.value
        assert v["steps"] == 1 and v["error"] == "PeerFailureError" and "CommError" in v["mro"], v



def test_compiled_ddp_same_numbers_as_eager() -> None:
    # dynamo compiled the route's Python frames that c10d's C++ entered from the eager part of a
    # compiled function (DDP's forward rebuilding its buckets, an async op's wait()) and raised
    # its own AssertionError ("DictGetItemSource index must be a ConstDictKeySource or literal")
    from tests.helpers.ranks import run_ranks

    for res in run_ranks(2, "tests.dist.ddp_workers:compiled", timeout=180, env=ROUTE):
        v = res.value
        assert _close(v["compiled"]["losses"], v["eager"]["losses"], 1e-5), v
        assert _close(v["compiled"]["params"], v["eager"]["params"], 1e-5) and v["waited"] == [7.0, 7.0], v
