"""A rank that sends heartbeats the way a communicator's failure monitor does (member
``rank/<rank>`` with its pid), then does what ``$BEHAVIOUR`` says on rank ``$TARGET_RANK``:

- ``gil_sleep``: sleeps 5 s in a C call that holds the GIL (heartbeats silent, no CPU);
- ``gil_busy``: spins 5 s in a C loop that holds the GIL (heartbeats silent, CPU busy);
- ``stop``: stops itself (SIGSTOP);
- ``hang``: sleeps forever in a C call holding the GIL (alive, no progress, heartbeats blocked).

Other ranks (and the target afterwards) write ``<rank>.done`` and exit 0. Rank 0 also records
every ``rank_failed`` event it sees in ``events.jsonl`` and, with ``WAIT_FOR_FAILURE=1``,
waits for one before it exits. Every rank writes ``<rank>.pid`` first.
"""
import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from torchcomms.control.client import ControlClient
from torchcomms.control.secrets import load_secret

rank = int(os.environ["RANK"])
out = Path(os.environ["PID_DIR"])
behaviour = os.environ.get("BEHAVIOUR", "")
target = int(os.environ.get("TARGET_RANK", "1"))
signal.signal(signal.SIGUSR1, lambda *_: (out / f"{rank}.usr1").write_text("dump"))
client = ControlClient(os.environ["TORCHCOMM_CONTROL_ADDR"], load_secret(), timeout=30)
client.heartbeat_start(f"rank/{rank}", 0.1, limit=1.0,
                       info={"host": socket.gethostname(), "pid": os.getpid()})
failed = threading.Event()
if rank == 0:
    def on_event(topic: str, payload: dict) -> None:
        with open(out / "events.jsonl", "a") as f:
            f.write(json.dumps(payload) + "\n")
        failed.set()
    client.subscribe(["rank_failed"], on_event, since=0)
(out / f"{rank}.pid").write_text(str(os.getpid()))
time.sleep(1.0)  # heartbeats flow before anything happens
libc = ctypes.PyDLL(None)  # a PyDLL call keeps the GIL for its whole length
if rank == target:
    t0 = time.monotonic()
    if behaviour == "gil_sleep":
        libc.usleep(5_000_000)
    elif behaviour == "gil_busy":
        n = 1_000_000
        while True:  # size one C loop from the last one's rate until it alone lasts 5 s
            t = time.monotonic()
            sum(range(n))  # a builtin over a range: one C loop, the GIL held throughout
            took = time.monotonic() - t
            if took >= 5.0:
                break
            # aim at 5.5 s; a short probe (or a loop that sped up) only grows it again
            n = int(n * min(max(5.5 / max(took, 1e-3), 1.2), 50.0))
    elif behaviour == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif behaviour == "hang":
        while True:
            libc.sleep(600)  # a signal ends sleep(): go back to it
    (out / f"{rank}.held").write_text(f"{time.monotonic() - t0:.3f}")
if rank == 0 and os.environ.get("WAIT_FOR_FAILURE") == "1":
    failed.wait(120)
else:
    time.sleep(1.0)
client.close()
(out / f"{rank}.done").write_text("ok")
sys.exit(0)
