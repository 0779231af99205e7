"""Object collectives and functional collectives (eager, torch.compile(fullgraph=True), autograd)."""
from __future__ import annotations

import torch

from tests.helpers.ranks import run_ranks


def test_object_collectives() -> None:
    n = 3
    results = run_ranks(n, "tests.dist.comm_workers:objects", timeout=180)
    for res in results:
        v, r = res.value, res.rank
        assert v["all_gather"] == [[q, 10 * q, [float(q)] * 2] for q in range(n)]
        assert v["gather"] == ([["g", q] for q in range(n)] if r == 1 else None)
        assert v["broadcast"] == [f"root{n - 1}", {"k": [1, 2]}]
        assert v["scatter"] == f"to{r}" * (r + 1)
        if r == 1:
            assert v["p2p"] == [1, "two", 3.0]
        assert v["opaque"] == "UnpicklingError"
        assert v["opaque_trusted"] == list(range(n))
        # the refusing rank raises its own CommValueError, the others CollectiveMismatchError
        # naming it (they waited for it until the timeout)
        refusers = {"scatter root list": 0, "gather root list": 0, "all_gather object": 1, "broadcast object": 0,
                    "send object": 0}
        assert len(v["refused"]) == (5 if r in (0, 1) else 4), v["refused"]
        for case, got in v["refused"].items():
            if r == refusers[case]:
                assert got.startswith("CommValueError"), (case, got)
            else:
                assert got.startswith("CollectiveMismatchError") and f"[{refusers[case]}]" in got, (case, got)
        assert v["after_refusals"] == list(range(n))


def test_functional_collectives_compile_fullgraph() -> None:
    n = 2
    results = run_ranks(n, "tests.dist.comm_workers:functional_compiled", timeout=300)
    xs = [torch.arange(n, dtype=torch.float32) + 10 * q for q in range(n)]
    g = torch.cat([x + 1 for x in xs])
    for res in results:
        v, r = res.value, res.rank
        want_a = sum(x * 2 for x in xs)
        want_s = (g * n).view(n, -1)[r]
        assert v["eager"][0] == want_a.tolist()
        assert v["eager"][1] == g.tolist()
        assert v["eager"][2] == want_s.tolist()
        # all_to_all of the gathered tensor (identical on every rank): block r of it, n times
        block = g.view(n, -1)[r]
        assert v["eager"][3] == block.repeat(n).tolist()
        assert v["compiled"] == v["eager"]
        assert v["grad_all_reduce"] == [float(n)] * n
        # d/dz sum(all_gather(z)^2) = reduce_scatter(2 * gathered) = n * 2 * z
        assert v["grad_all_gather"] == (2 * n * xs[r]).tolist()
        assert v["async_type"] == "TorchCommsAsyncTensor"
        assert v["async_wait"] == sum(xs).tolist()


def test_device_mesh_over_communicators() -> None:
    results = run_ranks(4, "tests.dist.comm_workers:device_mesh_2d", timeout=300)
    want = torch.zeros(4, 6)
    for q in range(4):
        want[(q // 2) * 2:(q // 2) * 2 + 2, (q % 2) * 3:(q % 2) * 3 + 3] = q
    for res in results:
        v, r = res.value, res.rank
        assert v["mesh"] == [[0, 1], [2, 3]]
        assert v["names"] == ["dp", "tp"]
        assert v["dp_ranks"] == [q for q in range(4) if q % 2 == r % 2]
        assert v["tp_ranks"] == [q for q in range(4) if q // 2 == r // 2]
        assert v["backend"] == "torchcomm"
        assert v["total"] == want.tolist()
        assert v["sum"] == float(want.sum())
        assert any(op.endswith(":all_gather_single") for op in v["ops"]), v["ops"]
