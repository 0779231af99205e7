"""Rank 1 looks hung to the control plane: a child process sends heartbeats as ``rank/1``
and vanishes without deregistering, while the worker itself stays alive, waiting. Its
SIGUSR1 handler writes <rank>.usr1 (a stand-in for a flight-recorder dump)."""
import os
import signal
import time
from pathlib import Path

rank = int(os.environ["RANK"])
out = Path(os.environ["PID_DIR"])
signal.signal(signal.SIGUSR1, lambda *_: (out / f"{rank}.usr1").write_text("dump"))
if rank == 1:
    child = os.fork()
    if child == 0:
        from torchcomms.control.client import ControlClient
        from torchcomms.control.secrets import load_secret

        client = ControlClient(os.environ["TORCHCOMM_CONTROL_ADDR"], load_secret(), timeout=10)
        client.heartbeat_start("rank/1", 0.1, limit=0.5)
        time.sleep(0.3)
        os._exit(0)  # no deregistration: the server sees the heartbeats stop
    os.waitpid(child, 0)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    time.sleep(0.05)
