"""Writes its pid, then prints a tick every 0.1 s for DURATION seconds and exits 0."""
import os
import time
from pathlib import Path

rank = os.environ["RANK"]
if os.environ.get("PID_DIR"):
    Path(os.environ["PID_DIR"], f"{rank}.pid").write_text(str(os.getpid()))
print(f"rank {rank} of {os.environ['WORLD_SIZE']} up", flush=True)
deadline = time.monotonic() + float(os.environ.get("DURATION", "1"))
while time.monotonic() < deadline:
    time.sleep(0.1)
print(f"rank {rank} done", flush=True)
