"""The mpi backend's hints: which collectives run as MPI's nonblocking calls.

MPI's nonblocking collectives (``libnbc`` in Open MPI) cost a few µs more than the blocking
ones for small messages and much more for large ones (measured, 2 ranks, shared memory: 1 KiB
2.4 vs 1.4 µs, 64 KiB 19.5 vs 12.5 µs, 1 MiB 201 vs 98 µs), but they can be started on the
caller's thread and polled there, bounded by the op's deadline, while a blocking call that waits
on a stopped peer can be left only by a thread of its own (the engine thread; handing an op to
it and back costs two thread wake-ups, ~25 µs measured under load). So small collectives are
nonblocking calls on the caller's thread, large ones blocking calls on the engine thread.

Measured on 2 quiet cores (2 ranks, all_reduce, tracing on, medians of 60): the caller-thread
path takes 22 / 25 / 30 / 44 / 93 µs at 1 / 4 / 16 / 64 / 256 KiB against the engine thread's
34 / 35 / 41 / 49 / 84 µs, and it stayed ahead up to 64 KiB with 8 busy processes per core (1 KiB
23-28 vs 33-36 µs; ``benchmarks/comm_bench.py --engine mpi --mpi-nonblocking-max 65536``). So
collectives up to 64 KiB take it by default (``mpi.nonblocking_max_bytes``), larger ones the
engine thread. Where ranks share cores with other multi-process jobs (load 33-45 on 2 cores) the
1-4 KiB caller-thread ops were measured at 270-320 µs against 47-64 µs: there,
``mpi.collectives=blocking`` puts every collective on the engine thread.
"""
from __future__ import annotations

from torchcomms.errors import CommValueError

#: ``nbytes`` of a collective whose ranks pass different sizes: the blocking call, except under
#: ``mpi.collectives=nonblocking`` (every rank must choose alike, whatever its own sizes)
UNEVEN = 1 << 61
#: the default of hint ``mpi.nonblocking_max_bytes``: collectives up to 64 KiB nonblocking
NONBLOCKING_MAX_BYTES = 64 << 10
_MODES = {"blocking": -1, "nonblocking": 1 << 62}


def nonblocking_max(hints: dict[str, str], name: str) -> int:
    """The largest collective (bytes) run as MPI's nonblocking call, from the hints
    ``mpi.nonblocking_max_bytes`` or ``mpi.collectives`` (``blocking``/``nonblocking``: all one
    kind). Every rank must pass the same hints."""
    mode, raw = hints.get("mpi.collectives"), hints.get("mpi.nonblocking_max_bytes")
    if mode is not None and mode not in _MODES:
        raise CommValueError(f"hint mpi.collectives={mode!r}: expected 'blocking' or 'nonblocking'",
                             comm=name, op="new_comm")
    if raw is None:
        return _MODES[mode] if mode is not None else NONBLOCKING_MAX_BYTES
    if mode is not None or not raw.isdigit():
        raise CommValueError(f"hint mpi.nonblocking_max_bytes={raw!r}: expected a byte count >= 0, without "
                             "mpi.collectives", comm=name, op="new_comm")
    return int(raw)
