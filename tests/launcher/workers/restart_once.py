"""Rank 1 fails (exit 5) on the first attempt; every rank succeeds on later attempts."""
import os
import sys

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {os.environ['RANK']} attempt {attempt}", flush=True)
if attempt == 0 and os.environ["RANK"] == "1":
    sys.exit(5)
