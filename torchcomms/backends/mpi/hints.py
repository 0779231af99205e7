"""The mpi backend's hints: which collectives run as MPI's nonblocking calls.

MPI's nonblocking collectives (``libnbc`` in Open MPI) cost a few µs more than the blocking
ones for small messages and much more for large ones (measured, 2 ranks, shared memory: 1 KiB
2.4 vs 1.4 µs, 64 KiB 19.5 vs 12.5 µs, 1 MiB 201 vs 98 µs), but they can be started on the
caller's thread and polled there, bounded by the op's deadline, while a blocking call that waits
on a stopped peer can be left only by a thread of its own (the engine thread; handing an op to
it and back costs two thread wake-ups, ~25 µs measured under load). So small collectives are
nonblocking calls on the caller's thread, large ones blocking calls on the engine thread.

That caller-thread path is off by default (``mpi.nonblocking_max_bytes`` unset: every
collective blocking on the engine thread, barrier included): measured on 2 shared, overloaded
cores (load 33-45), it cut the host CPU per 1 KiB all_reduce on one rank from 48.6 to 16.4 µs, but
at 2 ranks the 1-4 KiB all_reduce took 270-320 µs against 47-64 µs on the engine thread (16 KiB
and up: no worse). Whether it wins where ranks are not starved of cores is to be measured
(``benchmarks/comm_bench.py --engine mpi --mpi-nonblocking-max 262144``).
"""
from __future__ import annotations

from torchcomms.errors import CommValueError

#: ``nbytes`` of a collective whose ranks pass different sizes: the blocking call, except under
#: ``mpi.collectives=nonblocking`` (every rank must choose alike, whatever its own sizes)
UNEVEN = 1 << 61
#: the default of hint ``mpi.nonblocking_max_bytes``: none (every collective blocking)
NONBLOCKING_MAX_BYTES = -1
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
