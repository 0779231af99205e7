"""``TorchComm.get_options().store`` is the store the communicator met on, found or given."""
from __future__ import annotations

from tests.helpers.ranks import run_ranks


def test_found_store_is_exposed_and_shared() -> None:
    results = run_ranks(2, "tests.torchcomms.store_workers:options_store", timeout=120)
    for res in results:
        assert res.value == {"type": "TCPStore", "is_store": True, "read": "from rank 0", "child_same": True,
                             "given_kept": True}, res.value

