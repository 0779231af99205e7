"""The mpi backend's hints: which collectives run as MPI's nonblocking calls on the caller's thread.

A nonblocking call is started on the caller's thread and polled there, bounded by the op's
deadline, with no thread hand-off. A blocking call that waits on a stopped peer can be left only
by a thread of its own (the engine thread; handing an op to it and back costs two thread
wake-ups, 7-21 % of a 1 MiB all_reduce measured, see ``benchmarks/diagnostics/mpi_op_layers.py``).
So every collective is nonblocking where MPI's nonblocking form keeps pace with the blocking one.

Measured (bare mpi4py, 2 ranks on 2 cores and 4 ranks oversubscribed, shared memory,
``benchmarks/diagnostics/mpi_nonblocking_algorithms.py``): from 64 KiB to 16 MiB the nonblocking
broadcast, all-gather(v), reduce-scatter-block, all-to-all(v), gather and scatter took
0.75-1.10x the blocking call's time, and the all-reduce 0.96-1.09x under libnbc's Rabenseifner
algorithm (see :data:`.engine.LIBNBC_ALLREDUCE_VAR`; libnbc's own choice took 1.8-2.6x). The
nonblocking reduce took 2-3.5x, and reduce-scatter with per-rank counts 2.1x at 16 MiB: above
64 KiB those two stay blocking calls on the engine thread, as the all-reduce does above 64 KiB
where its algorithm is not known to keep pace (MPI initialised before torchcomms set it, or
another MPI than Open MPI).

``mpi.nonblocking_max_bytes=N`` makes every collective up to N bytes nonblocking and every larger
one blocking; ``mpi.collectives=blocking|nonblocking`` makes them all one kind (``blocking``
where ranks share cores with other jobs' ranks: at load 33-45 on 2 cores the 1-4 KiB
caller-thread ops were measured at 270-320 µs against 47-64 µs on the engine thread).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torchcomms.errors import CommValueError

#: ``nbytes`` of a collective whose ranks pass different sizes (every rank must choose alike,
#: whatever its own sizes): nonblocking only where the op is nonblocking at any size
UNEVEN = 1 << 61
#: a limit above every size, :data:`UNEVEN` included
ANY_SIZE = 1 << 62
#: the default limit of the collectives whose nonblocking form is slower: up to 64 KiB nonblocking
NONBLOCKING_MAX_BYTES = 64 << 10
#: mpi4py's nonblocking methods that keep pace with the blocking ones at every size (measured above)
KEEP_PACE = frozenset({"Ibarrier", "Ibcast", "Iallgather", "Iallgatherv", "Ireduce_scatter_block", "Ialltoall",
                       "Ialltoallv", "Igather", "Iscatter"})
_MODES = {"blocking": -1, "nonblocking": ANY_SIZE}
#: the hints this backend reads; another ``mpi.*`` key (a misspelt one) is refused
HINT_KEYS = ("mpi.collectives", "mpi.nonblocking_max_bytes")


@dataclass(frozen=True)
class CollectivePaths:
    """The largest collective (bytes) each of mpi4py's nonblocking methods runs as; larger ones
    are the blocking call on the engine thread."""

    default: int
    per_method: dict[str, int] = field(default_factory=dict)

    def limit(self, method: str) -> int:
        return self.per_method.get(method, self.default)


def collective_paths(hints: dict[str, str], name: str, allreduce_keeps_pace: bool) -> CollectivePaths:
    """The paths from the hints ``mpi.nonblocking_max_bytes`` or ``mpi.collectives``, else the
    measured defaults; ``allreduce_keeps_pace``: the all-reduce joins :data:`KEEP_PACE`. Every rank
    must pass the same hints (and the backend agrees on ``allreduce_keeps_pace``)."""
    unknown = _unknown_keys(hints)
    if unknown:
        raise CommValueError(f"unknown hint(s) {', '.join(unknown)}: the mpi backend's hints are "
                             f"{' and '.join(HINT_KEYS)}", comm=name, op="new_comm")
    mode, raw = hints.get("mpi.collectives"), hints.get("mpi.nonblocking_max_bytes")
    if mode is not None and mode not in _MODES:
        raise CommValueError(f"hint mpi.collectives={mode!r}: expected 'blocking' or 'nonblocking'",
                             comm=name, op="new_comm")
    if raw is None:
        if mode is not None:
            return CollectivePaths(_MODES[mode])
        fast = KEEP_PACE | {"Iallreduce"} if allreduce_keeps_pace else KEEP_PACE
        return CollectivePaths(NONBLOCKING_MAX_BYTES, {m: ANY_SIZE for m in fast})
    limit = _byte_count(raw)
    if mode is not None or limit is None:
        raise CommValueError(f"hint mpi.nonblocking_max_bytes={raw!r}: expected a byte count >= 0, without "
                             "mpi.collectives", comm=name, op="new_comm")
    return CollectivePaths(limit)


def _unknown_keys(hints: dict[str, str]) -> list[str]:
    return sorted(k for k in hints if k.startswith("mpi.") and k not in HINT_KEYS)


def _byte_count(raw: str) -> int | None:
    """``raw`` as a byte count (ASCII digits; a count past every size is :data:`ANY_SIZE`, so that
    it fits the 64-bit words the ranks compare), else ``None``."""
    if not (raw.isascii() and raw.isdigit()):
        return None
    return min(int(raw), ANY_SIZE)


#: mpi4py's nonblocking collectives the backend calls (``CollectivePaths.limit`` of each)
METHODS = ("Ibarrier", "Ibcast", "Iallreduce", "Ireduce", "Iallgather", "Iallgatherv", "Ireduce_scatter",
           "Ireduce_scatter_block", "Ialltoall", "Ialltoallv", "Iscatter", "Igather")
_MODE_CODES = {None: 0, "blocking": 1, "nonblocking": 2}
_UNKNOWN_KEY = 4
_INVALID = -3


def path_signature(hints: dict[str, str], name: str, allreduce_keeps_pace: bool
                   ) -> tuple[list[int], CollectivePaths | None, CommValueError | None]:
    """(``[mode, bytes, limit...]``: this rank's path hints and the limit of each of
    :data:`METHODS` they give, as ints for the ranks to compare; the paths; the error of invalid
    hints). Ranks route every collective alike exactly when their limits are equal."""
    mode, raw = hints.get("mpi.collectives"), hints.get("mpi.nonblocking_max_bytes")
    count = None if raw is None else _byte_count(raw)
    codes = [_UNKNOWN_KEY if _unknown_keys(hints) else _MODE_CODES.get(mode, 3),
             -1 if raw is None else -2 if count is None else count]
    try:
        paths = collective_paths(hints, name, allreduce_keeps_pace)
    except CommValueError as e:
        return codes + [_INVALID] * (1 + len(METHODS)), None, e
    return codes + [paths.default] + [paths.limit(m) for m in METHODS], paths, None


def describe_signature(sig: list[int]) -> str:
    """The path hints behind a :func:`path_signature`, for messages."""
    if sig[0] == _UNKNOWN_KEY:
        return "an unknown mpi.* hint"
    mode = {1: "blocking", 2: "nonblocking", 3: "an invalid value"}.get(sig[0])
    parts = [f"mpi.collectives={mode}"] if mode else []
    if sig[1] != -1:
        parts.append(f"mpi.nonblocking_max_bytes={sig[1] if sig[1] >= 0 else 'an invalid value'}")
    return " and ".join(parts) or "no path hint"


def paths_differ(sigs: list[list[int]]) -> bool:
    """Whether ranks of these signatures would route some collective differently (or one has
    invalid hints)."""
    return any(s[2:] != sigs[0][2:] or s[2] == _INVALID for s in sigs)
