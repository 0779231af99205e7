"""The anchor job of recovery_bench.py, written for torchrun: init_process_group("gloo"),
all_reduce in a loop; rank ``TC_VICTIM`` SIGKILLs itself at step 3 of the first attempt.
After torchrun restarts everyone, rank 0 records when the new group's first all_reduce is done.

Stock ``init_process_group("gloo")`` fails after torchrun's restart here (the agent's store
still holds the previous attempt's gloo addresses: "connectFullMesh failed ... Connection
refused"), so with ``TC_ATTEMPT_PREFIX=1`` the group rendezvous under a per-attempt prefix, the
usual user-side workaround; recovery_bench.py measures both.
"""
from __future__ import annotations

import json
import os
import signal
import time

import torch
import torch.distributed as dist

out = os.environ["TC_BENCH_DIR"]
rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
if os.environ.get("TC_ATTEMPT_PREFIX") == "1":
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store), rank=rank,
                            world_size=int(os.environ["WORLD_SIZE"]))
else:
    dist.init_process_group("gloo")
t = torch.ones(4096)
if attempt == 0:
    for step in range(1000):
        if rank == int(os.environ["TC_VICTIM"]) and step == 3:
            with open(os.path.join(out, "t_fail.json"), "w") as f:
                json.dump({"t": time.time()}, f)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(t)
        time.sleep(0.01)
else:
    dist.all_reduce(t)
    if rank == 0:
        with open(os.path.join(out, "t_first.json"), "w") as f:
            json.dump({"t": time.time(), "ok": bool(torch.all(t == dist.get_world_size()))}, f)
dist.destroy_process_group()
