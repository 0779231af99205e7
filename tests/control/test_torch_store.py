"""ControlStore as a torch Store: direct ops, PrefixStore, and gloo over it in 2 processes."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from torchcomms.control.client import ControlClient
from torchcomms.control.errors import ControlArgumentError, ControlArgumentTypeError, ControlTimeoutError
from torchcomms.control.server import StoreServer
from torchcomms.control.store import ControlStore

from .conftest import spawn_python, stop_process


@pytest.fixture
def store(client: ControlClient) -> ControlStore:
    return ControlStore(client, timeout=timedelta(seconds=10))


def test_store_ops(store: ControlStore) -> None:
    store.set("k", "text")
    store.set("b", b"\x00\x01")
    assert store.get("k") == b"text" and store.get("b") == b"\x00\x01"
    assert store.add("n", 3) == 3 and store.add("n", 4) == 7
    assert store.compare_set("cs", "", "v1") == b"v1"
    assert store.compare_set("cs", "v1", "v2") == b"v2"
    assert store.check(["k", "n"]) and not store.check(["zz"])
    store.wait(["k", "n"])
    store.wait(["k"], timedelta(seconds=1))
    assert store.num_keys() == 4
    assert store.delete_key("k") and not store.delete_key("k")
    store.append("log", "a")
    store.append("log", b"b")
    assert store.get("log") == b"ab"
    store.multi_set(["x", "y"], ["1", b"2"])
    assert store.multi_get(["x", "y"]) == [b"1", b"2"]
    assert sorted(store.list_keys()) == ["b", "cs", "log", "n", "x", "y"]
    assert store.has_extended_api()
    store.queue_push("q", "item")
    assert store.queue_len("q") == 1 and store.queue_pop("q") == b"item"
    with pytest.raises(dist.QueueEmptyError):
        store.queue_pop("q", block=False)


def test_timeouts_are_dist_store_errors(store: ControlStore) -> None:
    store.set_timeout(timedelta(milliseconds=200))
    assert store.timeout == timedelta(milliseconds=200)
    with pytest.raises(dist.DistStoreError) as info:
        store.get("missing")
    assert isinstance(info.value, ControlTimeoutError)
    assert "missing" in str(info.value)
    with pytest.raises(dist.DistStoreError):
        store.wait(["missing"], timedelta(milliseconds=100))


def test_prefix_store(store: ControlStore, client: ControlClient) -> None:
    prefixed = dist.PrefixStore("job/epoch3", store)
    prefixed.set("rank0", "hello")
    assert prefixed.get("rank0") == b"hello"
    assert prefixed.add("count", 2) == 2
    prefixed.wait(["rank0"])
    assert prefixed.check(["rank0", "count"])
    assert client.get("job/epoch3/rank0") == b"hello"
    nested = dist.PrefixStore("inner", prefixed)
    nested.set("x", b"1")
    assert client.get("job/epoch3/inner/x") == b"1"


def test_clone_shares_the_server(store: ControlStore) -> None:
    twin = store.clone()
    twin.set("from-twin", b"1")
    assert store.get("from-twin") == b"1"
    assert twin.timeout == store.timeout


def test_from_env(server: StoreServer, secret: bytes, tmp_path) -> None:
    from torchcomms.control.secrets import write_secret_file
    path = write_secret_file(tmp_path / "s", secret)
    assert ControlStore.from_env({}) is None
    store = ControlStore.from_env({"TORCHCOMM_CONTROL_ADDR": server.address,
                                   "TORCHCOMM_CONTROL_SECRET_FILE": str(path)})
    assert store is not None
    store.set("env", b"ok")
    assert store.get("env") == b"ok"
    store.close()
    assert store.client.closed


def test_bad_arguments(client: ControlClient, store: ControlStore) -> None:
    with pytest.raises(ControlArgumentTypeError, match="ControlClient"):
        ControlStore("tcp://x:1")  # type: ignore[arg-type]
    with pytest.raises(ControlArgumentTypeError, match="timedelta"):
        ControlStore(client, timeout=5)  # type: ignore[arg-type]
    with pytest.raises(ControlArgumentTypeError, match="value must be bytes or str"):
        store.set("k", 3.5)  # type: ignore[arg-type]
    with pytest.raises(ControlArgumentError, match="value as a list of ints must hold bytes"):
        store.set("k", [1, 300])  # type: ignore[arg-type]
    with pytest.raises(ControlArgumentError, match=r"values\[1\] as a list of ints must hold bytes"):
        store.multi_set(["a", "b"], [[1], [-1]])  # type: ignore[list-item]
    with pytest.raises(ControlArgumentTypeError, match="expected must be bytes or str, got list"):
        store.compare_set("k", [True], b"x")  # type: ignore[arg-type]


GLOO_RANK = """
import sys
from datetime import timedelta
import torch
import torch.distributed as dist
from torchcomms.control.store import ControlStore
addr, secret, rank = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3])
store = ControlStore.connect(addr, secret, timeout=timedelta(seconds=60))
pg = dist.ProcessGroupGloo(dist.PrefixStore("gloo-test", store), rank, 2, timedelta(seconds=60))
t = torch.arange(4, dtype=torch.float32) * (rank + 1)
pg.allreduce([t]).wait()
out = [torch.zeros(2), torch.zeros(2)]
pg.allgather([out], [torch.full((2,), float(rank))]).wait()
# the common user path too: the default group rendezvoused over our store
dist.init_process_group("gloo", store=dist.PrefixStore("default-pg", store), rank=rank,
                        world_size=2, timeout=timedelta(seconds=60))
u = torch.tensor([float(rank + 10)])
dist.all_reduce(u)
dist.barrier()
dist.destroy_process_group()
print(t.tolist(), [o.tolist() for o in out], u.item())
store.close()
"""


def test_gloo_process_group_over_control_store(server: StoreServer, secret: bytes) -> None:
    procs = [spawn_python(GLOO_RANK, server.address, secret.hex(), str(r), stdout=-1,
                          stderr=-1) for r in range(2)]
    try:
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            stop_process(p)
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
        assert out.strip() == "[0.0, 3.0, 6.0, 9.0] [[0.0, 0.0], [1.0, 1.0]] 21.0"


def test_store_cannot_be_pickled(store: ControlStore) -> None:
    import pickle
    with pytest.raises(TypeError, match="from_env"):
        pickle.dumps(store)
