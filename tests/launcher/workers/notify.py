"""Rank 0 subscribes to rank_failed on the job's event bus; rank 1 SIGKILLs itself once
rank 0 is listening. Rank 0 writes the delay between rank 1's death and the event to
$OUT_DIR/latency (seconds) and exits 0."""
import os
import signal
import threading
import time
from pathlib import Path

from torchcomms.control.client import ControlClient
from torchcomms.control.secrets import load_secret

rank = int(os.environ["RANK"])
out = Path(os.environ["OUT_DIR"])
client = ControlClient(os.environ["TORCHCOMM_CONTROL_ADDR"], load_secret(), timeout=30)
if rank == 1:
    client.get("test/listening", timeout=30)
    (out / "death").write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)
got = threading.Event()
received: dict = {}


def on_event(topic, payload):
    if topic == "rank_failed" and payload.get("rank") == 1 and not got.is_set():
        received.update(payload, recv=time.time())
        got.set()


sub = client.subscribe(None, on_event, since=None)
client.set("test/listening", b"1")
assert got.wait(30), "no rank_failed event"
death = float((out / "death").read_text())
(out / "latency").write_text(repr(received["recv"] - death))
(out / "payload").write_text(repr({k: received.get(k) for k in ("rank", "signal", "reason")}))
sub.close()
client.close()
