"""Starts a program in a session of its own (out of reach of the worker's process group, as a
daemonizing helper is), writes its pid to <rank>.pid, then exits 0 (or, with STAY=1, sleeps
until the launcher stops it)."""
import os
import subprocess
import sys
import time
from pathlib import Path

rank = int(os.environ["RANK"])
out = Path(os.environ["PID_DIR"])
daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
(out / f"{rank}.pid.tmp").write_text(str(daemon.pid))
os.replace(out / f"{rank}.pid.tmp", out / f"{rank}.pid")
if os.environ.get("STAY") == "1":
    while True:
        time.sleep(0.05)
