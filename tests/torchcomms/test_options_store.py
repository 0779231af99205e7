"""``TorchComm.get_options().store`` is the store the communicator met on, found or given."""
from __future__ import annotations

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
