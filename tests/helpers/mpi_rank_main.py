"""Entry point of one MPI test rank: ``python -m tests.helpers.mpi_rank_main module:fn kwargs_json dir``.

Writes ``dir/pid<rank>`` at start and ``dir/rank<rank>.json`` at the end (see ``rank_main``).
A rank that succeeded leaves through the interpreter's exit and so ``MPI_Finalize`` (``mpiexec``
treats a rank that exits without it as failed and ends the job) and the library's exit guard;
one that failed exits at once with its code.
"""
from __future__ import annotations

import os
import sys
import time

from tests.helpers.rank_main import run_target


def main() -> None:
    target, kwargs_json, out_dir = sys.argv[1:4]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    with open(os.path.join(out_dir, f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    code = run_target(target, kwargs_json, os.path.join(out_dir, f"rank{rank}.json"))
    _wait_for_results(out_dir)
    if code == 0:
        sys.exit(0)  # atexit: the mpi backend's guard, then mpi4py's MPI_Finalize
    os._exit(code)


def _wait_for_results(out_dir: str) -> None:
    """With ``TC_EXIT_AFTER_RESULTS=0,1,...``: wait (at most 60 s) until those ranks wrote their
    results before exiting, for jobs whose exit ends the whole job (the exit guard's MPI_Abort
    after a peer stopped) and would otherwise kill a rank still writing its result."""
    ranks = [int(r) for r in os.environ.get("TC_EXIT_AFTER_RESULTS", "").split(",") if r.strip()]
    deadline = time.monotonic() + 60.0
    while ranks and time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(out_dir, f"rank{r}.json")) for r in ranks):
            return
        time.sleep(0.01)


if __name__ == "__main__":
    main()
