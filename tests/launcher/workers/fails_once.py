"""Attempts below FAIL_ATTEMPTS (default 1, i.e. attempt 0): rank FAIL_RANK (default 0) exits
FAIL_CODE (default 3) after FAIL_AFTER seconds (default 0.3) while the other ranks sleep;
later attempts: every rank exits 0. Each rank first prints its attempt and its error file."""
import os
import sys
import time

rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {rank} attempt {attempt} error file {os.environ['TORCHELASTIC_ERROR_FILE']}",
      flush=True)
if attempt >= int(os.environ.get("FAIL_ATTEMPTS", "1")):
    sys.exit(0)
if rank == int(os.environ.get("FAIL_RANK", "0")):
    time.sleep(float(os.environ.get("FAIL_AFTER", "0.3")))
    sys.exit(int(os.environ.get("FAIL_CODE", "3")))
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    time.sleep(0.05)
