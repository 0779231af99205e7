"""all_reduce in a loop over torchcomms until a peer is lost, then shrink and verify the
survivors' first all_reduce; writes result<rank>.json to PID_DIR. Used by the node-loss test."""
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch

import torchcomms
from torchcomms import ReduceOp

out = Path(os.environ["PID_DIR"])
rank = int(os.environ["RANK"])
out.joinpath(f"{rank}.pid").write_text(str(os.getpid()))
comm = torchcomms.new_comm("gloo", torch.device("cpu"), "dp", timeout=timedelta(seconds=60))
t = torch.ones(1024)
result = {"rank": rank}
try:
    while True:
        comm.all_reduce(t, ReduceOp.SUM, False)
        time.sleep(0.05)
except torchcomms.CommError as e:
    result["raised"] = type(e).__name__
    result["detected_by"] = getattr(e, "detected_by", None)
    result["failed_ranks"] = getattr(e, "failed_ranks", None)
new = comm.shrink()
x = torch.tensor([float(rank)])
new.all_reduce(x, ReduceOp.SUM, False)
result.update(survivors=new.get_global_ranks(), new_rank=new.get_rank(), sum=x.item())
out.joinpath(f"result{rank}.json").write_text(json.dumps(result))
print(f"rank {rank} shrunk to {new.get_global_ranks()}", flush=True)
new.finalize()
