"""Writes its pid, then sleeps. IGNORE_TERM_RANKS=1,2 ignore SIGTERM and SIGINT (hung);
SIGUSR1 writes <rank>.usr1 (stands in for a flight-recorder dump), except on NO_USR1_RANKS
(SIGUSR1's default action, as in a program that dumps nothing). EXIT_RANK/EXIT_CODE
make one rank exit with that code after EXIT_AFTER seconds. SLEEP bounds the sleep.
CHILD_RANKS=1,2 first start a child in their process group that sleeps on (its pid in <rank>.child)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

rank = int(os.environ["RANK"])
out = Path(os.environ["PID_DIR"])
if str(rank) in os.environ.get("IGNORE_TERM_RANKS", "").split(","):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def on_usr1(signum, frame):
    (out / f"{rank}.usr1").write_text("dump")


if str(rank) not in os.environ.get("NO_USR1_RANKS", "").split(","):
    signal.signal(signal.SIGUSR1, on_usr1)
if str(rank) in os.environ.get("CHILD_RANKS", "").split(","):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (out / f"{rank}.child.tmp").write_text(str(child.pid))
    os.replace(out / f"{rank}.child.tmp", out / f"{rank}.child")
(out / f"{rank}.pid.tmp").write_text(str(os.getpid()))
os.replace(out / f"{rank}.pid.tmp", out / f"{rank}.pid")
print(f"rank {rank} pid {os.getpid()} ready", flush=True)
if os.environ.get("EXIT_RANK") == str(rank):
    time.sleep(float(os.environ.get("EXIT_AFTER", "0")))
    sys.exit(int(os.environ.get("EXIT_CODE", "3")))
deadline = time.monotonic() + float(os.environ.get("SLEEP", "600"))
while time.monotonic() < deadline:
    time.sleep(0.05)
