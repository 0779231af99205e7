"""c10d's ``monitored_barrier`` on a communicator (gloo's algorithm, on the communicator's
send/recv): every rank but 0 sends rank 0 a token and waits for its answer; rank 0 waits for
each rank's token within the timeout and answers only once every rank has arrived, or raises
naming the ranks that did not (the first of them, or all with ``wait_all_ranks``)."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from torchcomms.core.errors import CommError, CommTimeoutError, PeerFailureError

OP = "monitored_barrier"


def monitored_barrier(comm: Any, timeout: timedelta | None, wait_all_ranks: bool) -> None:
    """Returns once every rank of ``comm`` reached it; raises ``CommTimeoutError`` (or
    ``PeerFailureError`` where a missing rank is known to have failed) otherwise."""
    size, rank = comm.get_size(), comm.get_rank()
    if size == 1:
        return
    limit = timeout if timeout is not None else comm.get_options().timeout
    token = torch.zeros(1, dtype=torch.uint8, device=comm.get_device())
    if rank != 0:
        try:
            for work in (comm.send(token, 0, True, timeout=limit), comm.recv(token.clone(), 0, True, timeout=limit)):
                work.wait()
        except CommError as e:
            raise type(e)(f"rank {rank} reached {OP}, but its exchange with rank 0 failed (see rank 0's "
                          f"error for the ranks that did not arrive): {e}", comm=comm.get_name(), op=OP) from e
        return
    arrivals = [(peer, comm.recv(token.clone(), peer, True, timeout=limit)) for peer in range(1, size)]
    failed: dict[int, CommError] = {}
    for peer, work in arrivals:
        try:
            work.wait()
        except CommError as e:
            failed[peer] = e
            if not wait_all_ranks:
                break
    if failed:
        _raise_missing(comm, failed, limit)
    for work in [comm.send(token, peer, True, timeout=limit) for peer in range(1, size)]:
        work.wait()


def _raise_missing(comm: Any, failed: dict[int, CommError], limit: timedelta) -> None:
    ranks = sorted(failed)
    ms = int(limit.total_seconds() * 1000)
    who = f"Rank {ranks[0]}" if len(ranks) == 1 else "Ranks " + ", ".join(map(str, ranks))
    message = f"{who} failed to pass monitoredBarrier in {ms} ms"  # c10d's gloo words
    first = failed[ranks[0]]
    dead = [r for r, e in failed.items() if isinstance(e, PeerFailureError)]
    if dead:
        raise PeerFailureError(message, failed_ranks=dead, comm=comm.get_name(), op=OP, ranks=ranks) from first
    raise CommTimeoutError(message, timeout_s=limit.total_seconds(), missing_ranks=ranks, comm=comm.get_name(),
                           op=OP, ranks=ranks) from first
