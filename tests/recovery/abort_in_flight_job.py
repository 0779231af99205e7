"""One rank of tests/recovery/test_abort_in_flight.py, under ``torchcomms-run`` (its control
plane attributes connection losses): rank 0 starts an all_reduce that rank 1 (alive) never
joins and aborts the communicator; it prints one JSON line: how the op ended and how many
times the engine's error was sent to the control plane for attribution."""
from __future__ import annotations

import json
from datetime import timedelta

import torch

import torchcomms

comm = torchcomms.new_comm("gloo", torch.device("cpu"), "abort_in_flight", timeout=timedelta(seconds=60),
                           abort_process_on_timeout_or_error=False)
comm.all_reduce(torch.ones(4), torchcomms.ReduceOp.SUM, async_op=False)  # the engine's connections are up
store = torchcomms.job_store()
if comm.get_rank() == 0:
    monitor = comm._core.monitor
    asked: list[object] = []
    explain = monitor.explain_connection_loss
    monitor.explain_connection_loss = lambda *a: (asked.append(a), explain(*a))[1]
    work = comm.all_reduce(torch.ones(1000), torchcomms.ReduceOp.SUM, async_op=True)
    comm.abort()
    try:
        work.wait()
        error = None
    except torchcomms.CommError as e:
        error = type(e).__name__
    print("RESULT " + json.dumps({"error": error, "attributions": len(asked)}), flush=True)
    store.set("abort_in_flight/done", b"1")
else:
    store.wait(["abort_in_flight/done"])
    comm.abort()
