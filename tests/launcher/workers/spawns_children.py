"""Starts what a training script starts besides itself, writes their pids to <rank>.kids (one
line each), then sleeps until it is killed: ``sleep 600`` (a program), a Python child (a data
loader's worker), both in the worker's process group; with DAEMON=1 also a double-forked daemon
in a session of its own, and with DAEMON_ENV=clear that daemon starts with an environment of its
own (only PATH)."""
import os
import subprocess
import sys
import time
from pathlib import Path

rank = int(os.environ["RANK"])
out = Path(os.environ["PID_DIR"])
quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
kids = [subprocess.Popen(["sleep", "600"], **quiet).pid,
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], **quiet).pid]
if os.environ.get("DAEMON") == "1":
    env = {"PATH": os.environ["PATH"]} if os.environ.get("DAEMON_ENV") == "clear" else None
    daemonize = ("import os, subprocess, sys, time\n"
                 "os.setsid()\n"
                 "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
                 " stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
                 "print(p.pid, flush=True)\n")  # exits at once: the daemon is orphaned
    first = subprocess.run([sys.executable, "-c", daemonize], env=env, capture_output=True, text=True, check=True)
    kids.append(int(first.stdout))
(out / f"{rank}.kids.tmp").write_text("\n".join(map(str, kids)))
os.replace(out / f"{rank}.kids.tmp", out / f"{rank}.kids")
(out / f"{rank}.pid.tmp").write_text(str(os.getpid()))
os.replace(out / f"{rank}.pid.tmp", out / f"{rank}.pid")
while True:
    time.sleep(1)
