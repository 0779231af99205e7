"""``TorchComm.get_options().store`` is the store the communicator met on, found or given."""
from __future__ import annotations

import pytest

from tests.helpers.ranks import run_ranks


def test_found_store_is_exposed_and_shared() -> None:
    results = run_ranks(2, "tests.torchcomms.store_workers:options_store", timeout=120)
    for res in results:
        assert res.value == {"type": "TCPStore", "is_store": True, "read": "from rank 0", "child_same": True,
                             "given_kept": True}, res.value



def test_each_torchrun_attempt_meets_apart_on_the_agents_store() -> None:
    """Under torchrun the agent hosts the store and keeps it across restarts: attempt 1's ranks
    must not read attempt 0's engine addresses (its rank 1 met a gone rank 0: "Connection
    refused"), and no rank tries to host the agent's port."""
    import torch.distributed as dist

    from tests.helpers.ports import free_port
    from tests.helpers.ranks import RankGroup

    port = free_port()
    agent = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    for attempt, delay in ((0, 0.0), (1, 1.0)):
        env = {"MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True",
               "TORCHELASTIC_RESTART_COUNT": str(attempt)}
        with RankGroup(2, "tests.torchcomms.store_workers:attempt_under_agent_store", {"delay_s": delay},
                       env=env) as g:
            results = g.wait(60)
        for res in results:
            assert res.ok(), f"attempt {attempt} rank {res.rank}: {res.error}\n{res.stderr[-2000:]}"
            assert res.value == [3.0, 3.0]
            assert "failed to bind" not in res.stderr
    del agent


def test_a_rank_given_to_two_processes_is_refused_to_the_second_at_once() -> None:
    """Before, the second process waited for its rendezvous until the timeout (60 s here) and
    then named no cause."""
    from tests.helpers.ranks import RankGroup

    env = {r: {"TORCHCOMM_RANK": str(min(r, 1)), "TORCHCOMM_SIZE": "2"} for r in range(3)}
    with RankGroup(3, "tests.torchcomms.store_workers:rank_claimed_twice", per_rank_env=env) as g:
        results = g.wait(90)
    assert all(res.ok() for res in results), [(res.error, res.stderr[-1500:]) for res in results]
    refused = [res.value for res in results if "error" in res.value]
    assert len(refused) == 1 and results[0].value == {"sum": [3.0, 3.0]}, [res.value for res in results]
    assert "rank 1 of 2 is already claimed by another process" in refused[0]["error"]
    assert "came from TORCHCOMM_RANK" in refused[0]["error"]


def test_a_master_port_in_use_is_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 that cannot host the store at MASTER_PORT was told the store's host was gone."""
    import socket
    from datetime import timedelta

    import torch

    import torchcomms

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        for var, value in (("TORCHCOMM_RANK", "0"), ("TORCHCOMM_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"),
                           ("MASTER_PORT", str(busy.getsockname()[1]))):
            monkeypatch.setenv(var, value)
        monkeypatch.delenv("TORCHCOMM_CONTROL_ADDR", raising=False)
        with pytest.raises(torchcomms.CommValueError, match="rank 0 could not host the TCPStore at 127.0.0.1:.*"
                           "the port is in use"):
            torchcomms.new_comm("gloo", torch.device("cpu"), "port-in-use", timeout=timedelta(seconds=20))


def test_a_communicator_meets_on_the_store_of_c10ds_default_group() -> None:
    """Before, rank 0 could not host its own store at MASTER_PORT, which c10d's held."""
    for res in run_ranks(2, "tests.torchcomms.store_workers:beside_c10d_default_group", timeout=60):
        assert res.value == [6.0, 6.0]
