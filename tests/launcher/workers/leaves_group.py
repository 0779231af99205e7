"""Moves itself out of the process group the launcher made for it (into JOIN_PGID's, in the
same session), ignores SIGTERM, writes its pid, then sleeps at most SLEEP seconds."""
import os
import signal
import time
from pathlib import Path

os.setpgid(0, int(os.environ["JOIN_PGID"]))
signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = Path(os.environ["PID_DIR"])
(out / "pid.tmp").write_text(str(os.getpid()))
os.replace(out / "pid.tmp", out / "pid")
deadline = time.monotonic() + float(os.environ.get("SLEEP", "60"))
while time.monotonic() < deadline:
    time.sleep(0.05)
