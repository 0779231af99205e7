"""Run a function over many inputs in worker processes, results in input order.

The viewer parses one dump per rank; at 1,024 ranks that is seconds of CPU per core, so the
files are spread over one process per usable CPU. Workers are forked (the parent holds nothing
big yet) and return what they made by pickle; an exception in a worker is raised in the caller
when its input's turn comes, so the first bad input in order is the one reported.

A map that ends early (an error, or the caller stops iterating) cancels the chunks still
waiting and lets those already handed to the workers finish (the executor's call queue holds
one more than there are workers): a worker is never killed in the middle of an item. ``multiprocessing.Pool.terminate`` did kill
them, and can leave a result half-written into the pool's pipe or a pipe lock held; the
viewer's load once stalled 131 s stopping its pool after a bad dump.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TypeVar

__all__ = ["usable_cpus", "ordered_map"]

_T = TypeVar("_T")
_R = TypeVar("_R")

#: fewer inputs than this are run in the caller's process (a pool would cost more than it saves)
MIN_PARALLEL = 8
#: workers by default at most (each holds ~35 MiB resident while it parses a 2,048-entry dump;
#: more processes than this rarely help a job of dumps that the caller must then join)
MAX_DEFAULT_WORKERS = 8


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def ordered_map(fn: Callable[[_T], _R], items: Sequence[_T], workers: int | None = None) -> Iterator[_R]:
    """``fn(item)`` for each item, in order; in ``workers`` processes (default: one per usable
    CPU, at most :data:`MAX_DEFAULT_WORKERS`) when there are at least :data:`MIN_PARALLEL` items
    and more than one worker, else here."""
    n = min(usable_cpus(), MAX_DEFAULT_WORKERS) if workers is None else workers
    n = min(n, len(items))
    if n <= 1 or len(items) < MIN_PARALLEL:
        yield from map(fn, items)
        return
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    chunk = max(1, min(8, len(items) // (n * 8)))
    with ProcessPoolExecutor(n, mp_context=mp.get_context(method)) as pool:  # its exit waits, kills nothing
        futures: list[Future[tuple[list[_R], BaseException | None]]] = [
            pool.submit(_run_chunk, fn, items[i:i + chunk]) for i in range(0, len(items), chunk)]
        try:
            for future in futures:
                results, error = future.result()
                yield from results
                if error is not None:
                    raise error
        finally:
            pool.shutdown(cancel_futures=True)  # drops the chunks no worker took; the running ones finish


def _run_chunk(fn: Callable[[_T], _R], chunk: Sequence[_T]) -> tuple[list[_R], BaseException | None]:
    """``fn`` over one chunk in a worker: the results up to the first error, and that error."""
    results: list[_R] = []
    for item in chunk:
        try:
            results.append(fn(item))
        except Exception as e:  # noqa: BLE001 - raised in the caller at this item's turn
            return results, e
    return results, None
