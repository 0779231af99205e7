"""Writes the agent's mark of its workers' processes (TORCHCOMM_AGENT_MARK) to PID_DIR/mark,
then exits 0 once the file EXIT_WHEN exists."""
import os
import time
from pathlib import Path

out = Path(os.environ["PID_DIR"])
(out / "mark.tmp").write_text(os.environ["TORCHCOMM_AGENT_MARK"])
os.replace(out / "mark.tmp", out / "mark")
while not os.path.exists(os.environ["EXIT_WHEN"]):
    time.sleep(0.02)
