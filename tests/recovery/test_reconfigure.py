"""The reference API's reconfigure path: init handles, re-forming over a subset, revoke."""
from __future__ import annotations

import socket

from tests.helpers.ranks import free_port, run_ranks


def _check(res: dict[int, dict]) -> None:
    # configuration a: [rank 2, rank 0]
    assert res[2]["a_rank"] == 0 and res[0]["a_rank"] == 1
    assert res[0]["a_size"] == res[2]["a_size"] == 2
    assert res[0]["a_sum"] == res[2]["a_sum"] == 2.0
    assert res[0]["work_ok"] and res[0]["revoked"] and res[0]["after_revoke"] == "CommAbortedError"
    assert "does not contain this rank's handle" in res[1]["excluded_error"]
    # configuration b: everyone, reversed
    for r in range(3):
        assert res[r]["b_rank"] == 2 - r and res[r]["b_size"] == 3
        assert res[r]["b_sum"] == 6.0


def test_reconfigure_subset_revoke_and_reform() -> None:
    _check({r.rank: r.value for r in run_ranks(3, "tests.recovery.workers:reconfigure_flow", timeout=180)})


def _port_whose_successor_is_taken() -> tuple[int, socket.socket]:
    """A free port P, and a socket bound to P+1 (the caller keeps it open)."""
    while True:
        port = free_port()
        taken = socket.socket()
        try:
            taken.bind(("127.0.0.1", port + 1))
        except OSError:
            taken.close()
            continue
        return port, taken


def test_reconfigure_flow_needs_no_port_beside_master_port() -> None:
    # The worker once hosted a second TCPStore at MASTER_PORT+1, a port nobody reserved. free_port()
    # (bind to port 0) always returns an odd port, and Linux hands even ports to outgoing
    # connections, so under a full suite MASTER_PORT+1 was sometimes some connection's local port:
    # rank 0 died of EADDRINUSE and ranks 1 and 2 retried to connect for TCPStore's default 300 s,
    # past the runner's 180 s ("rank 1 did not finish within 180 s"). Here that port is taken.
    port, taken = _port_whose_successor_is_taken()
    with taken:
        res = run_ranks(3, "tests.recovery.workers:reconfigure_flow", timeout=90, env={"MASTER_PORT": str(port)})
    _check({r.rank: r.value for r in res})


def test_a_reconfigure_that_timed_out_stays_failed_when_its_engine_arrives_late() -> None:
    # The engine build of a reconfigure used to rebind the communicator whenever it finished: one
    # that finished after the reconfigure had raised CommTimeoutError silently made the broken
    # communicator usable again, on an engine the caller had been told was not formed.
    res = run_ranks(2, "tests.recovery.workers:reconfigure_ending_after_its_timeout", timeout=120)
    for r in res:
        assert r.value["wait"] == "CommTimeoutError"
        assert r.value["broken_after"] is True
        assert r.value["op_after"] == "CommAbortedError"
        assert r.value["retry_sum"] == 3.0
