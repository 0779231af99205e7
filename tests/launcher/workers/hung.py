"""Rank 1 looks hung to the control plane: a child process sends heartbeats as ``rank/1``
and vanishes without deregistering, while the worker itself stays alive, waiting. Its
SIGUSR1 handler writes <rank>.usr1 (a stand-in for a flight-recorder dump).
With HUNG_ONCE=1 only rank 1's first process looks hung: its replacement (``--max-restarts``)
writes 1.replaced and exits 0 a second later, and rank 0 then exits 0."""
import os
import signal
import sys
import time
from pathlib import Path

rank = int(os.environ["RANK"])
out = Path(os.environ["PID_DIR"])
signal.signal(signal.SIGUSR1, lambda *_: (out / f"{rank}.usr1").write_text("dump"))
once = os.environ.get("HUNG_ONCE") == "1"
if once and rank == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
    time.sleep(1)
    (out / "1.replaced").write_text("")
    sys.exit(0)
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
while time.monotonic() < deadline and not (once and (out / "1.replaced").exists()):
    time.sleep(0.05)
