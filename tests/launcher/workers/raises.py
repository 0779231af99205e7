"""Rank 1 raises inside an entry point decorated with launcher.record; others wait."""
import os
import time

from launcher import record


@record
def main() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("batch 7 has a NaN")
    time.sleep(60)


main()
