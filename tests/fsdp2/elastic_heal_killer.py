"""examples/train_elastic_fsdp.py with a failure in the middle of a heal: the second process of
rank ``TC_HEAL_VICTIM`` SIGKILLs itself as soon as its replica is admitted (the store key
``fsdp2.elastic/elastic/admit/<replica>/i2``, docs/INTERNALS.md), while the live ranks re-form
the communicators with it and send it the state."""
from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time

import torchcomms

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_elastic_fsdp.py")
rank, victim, shard = int(os.environ["RANK"]), int(os.environ["TC_HEAL_VICTIM"]), int(os.environ["TC_SHARD"])
if rank == victim and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "1":

    def kill_when_admitted() -> None:
        store = torchcomms.job_store()
        key = f"fsdp2.elastic/elastic/admit/{rank // shard}/i2"
        while not store.check([key]):
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=kill_when_admitted, daemon=True).start()
sys.argv = [EXAMPLE, *sys.argv[1:]]
runpy.run_path(EXAMPLE, run_name="__main__")
