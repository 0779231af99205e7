"""A worker of ``mpiexec -n N torchcomms-run --backend mpi``: an mpi communicator over the MPI
job, a checked all_reduce; with VICTIM=<rank> that rank is SIGKILLed mid-loop and (with
SHRINK=1) the survivors shrink and check an all_reduce. Writes result<rank>.json to PID_DIR."""
import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import torch

import torchcomms
from torchcomms import ReduceOp

out = Path(os.environ["PID_DIR"])
rank = int(os.environ["RANK"])
out.joinpath(f"{rank}.pid").write_text(str(os.getpid()))
comm = torchcomms.new_comm("mpi", torch.device("cpu"), "job", timeout=timedelta(seconds=30),
                           abort_process_on_timeout_or_error=False)
n = comm.get_size()
t = torch.full((1024,), float(rank))
comm.all_reduce(t, ReduceOp.SUM, False)
result = {"rank": rank, "mpi_rank": int(os.environ["OMPI_COMM_WORLD_RANK"]), "size": n, "sum": t[0].item(),
          "store": type(comm.get_options().store).__name__ if comm.get_options().store is not None else None,
          "monitor": comm._core.monitor is not None}
victim = int(os.environ.get("VICTIM", "-1"))
if victim >= 0:
    if rank == victim:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        while True:
            comm.all_reduce(torch.ones(16), ReduceOp.SUM, False)
            time.sleep(0.01)
    except torchcomms.CommError as e:
        result.update(raised=type(e).__name__, failed_ranks=getattr(e, "failed_ranks", None),
                      detected_by=getattr(e, "detected_by", None))
    if os.environ.get("SHRINK") == "1":
        new = comm.shrink()
        x = torch.tensor([float(rank)])
        new.all_reduce(x, ReduceOp.SUM, False)
        result.update(survivors=new.get_global_ranks(), new_sum=x.item(), agreed=new.agree(True))
        new.finalize()
    else:
        comm.abort()
else:
    comm.finalize()
out.joinpath(f"result{rank}.json").write_text(json.dumps(result))
print(f"rank {rank} done", flush=True)
