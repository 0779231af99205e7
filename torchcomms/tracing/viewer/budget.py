"""What reading one dump may cost a worker, and how much it may hand back.

A dump is untrusted. A pickle of a few hundred bytes can make ``pickle.load`` itself run for
ever (a dict key or set member of tuples nested 60 deep, each level ``(t, t)`` of the one below
from the memo: hashing it takes 2**60 steps inside C, where no Python signal handler runs), and
one that refers to one list again and again ("billion laughs") stands for more values than
memory holds once anything spells it out (``str``, a copy, a loop over it). So each dump is read
in a worker process whose CPU time and address space the kernel bounds (:func:`limits_for`,
applied by :mod:`.parallel`, which also bounds the answer a worker sends back, pickled), and
what it hands back is measured spelled out (:func:`spelled_out`): nothing the viewer then holds
or does with a dump costs more than the dump's size allows.
"""
from __future__ import annotations

import marshal
import os
from typing import Any

import numpy as np

from torchcomms.tracing.viewer.parallel import Limits

__all__ = ["ANSWER_BYTES", "ANSWER_PER_BYTE", "CPU_S", "CPU_S_PER_MIB", "MEMORY_BYTES", "MEMORY_PER_BYTE",
           "SPELLED_OUT_BYTES", "SPELLED_OUT_PER_BYTE", "limits_for", "spelled_out", "spelled_out_budget"]

#: CPU seconds a worker may spend on one file, plus :data:`CPU_S_PER_MIB` per MiB of it. A
#: 2,048-entry dump (0.5 MiB) takes 12-20 ms: the budget is hundreds of times what a dump
#: needs. CPU time, not wall time: a saturated machine slows a worker without using it up.
CPU_S = 10
CPU_S_PER_MIB = 1
#: address space a worker may take on for one file, plus :data:`MEMORY_PER_BYTE` per byte of it
#: (a 0.5 MiB dump takes on about 7 MiB), at most half the machine's memory over the workers
MEMORY_BYTES = 1 << 30
MEMORY_PER_BYTE = 64
#: bytes a dump's parse may hand back spelled out (every op with its communicator, sizes, dtypes
#: and call stack, as marshal writes them without back-references), plus
#: :data:`SPELLED_OUT_PER_BYTE` per byte of the file: a recorder's dump spells out to under one
#: byte per byte (0.86 for the benchmark's), one that shares long strings among entries to tens
SPELLED_OUT_BYTES = 4 << 20
SPELLED_OUT_PER_BYTE = 256
#: bytes a dump's parse may hand back pickled (what the viewer then holds of it), plus
#: :data:`ANSWER_PER_BYTE` per byte of the file: a recorder's 0.5 MiB dump hands back 0.27 bytes
#: per byte, PyTorch's with 24-frame stacks 0.4; 1,024 hostile files cannot fill the viewer
ANSWER_BYTES = 1 << 20
ANSWER_PER_BYTE = 4


def limits_for(size: int, workers: int, cpu_s: int | None = None) -> Limits:
    """The bounds of reading a file of ``size`` bytes with ``workers`` workers at once;
    ``cpu_s`` in place of the CPU budget of :data:`CPU_S` and :data:`CPU_S_PER_MIB`."""
    memory = MEMORY_BYTES + MEMORY_PER_BYTE * size
    try:
        share = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (2 * workers)
        memory = min(memory, share)
    except (ValueError, OSError, AttributeError):  # no sysconf names here: the budget alone
        pass
    cpu = CPU_S + CPU_S_PER_MIB * (size >> 20) if cpu_s is None else cpu_s
    return Limits(cpu, memory, ANSWER_BYTES + ANSWER_PER_BYTE * size)


def spelled_out_budget(size: int) -> int:
    """Bytes the parse of a file of ``size`` bytes may hand back, spelled out."""
    return SPELLED_OUT_BYTES + SPELLED_OUT_PER_BYTE * size


def spelled_out(dump: Any) -> int:
    """Bytes of ``dump`` (a :class:`~.load.RankDump` read from a file) with every shared value
    written once per op that uses it: each op's kind and state, the communicators, the texts."""
    ops = dump.ops
    total = _times_used([len(marshal.dumps(tuple(k), 2)) for k in ops.kinds], ops.kind)
    total += _times_used([len(marshal.dumps(s, 2)) for s in ops.states], ops.state)
    total += len(marshal.dumps([(c.name, c.desc, c.ranks, c.backend) for c in dump.comms.values()], 2))
    return total + sum(len(s) for s in (dump.path, dump.version, dump.run_id, dump.host, dump.reason) if s)


def _times_used(sizes: list[int], rows: np.ndarray) -> int:
    counts = np.bincount(rows, minlength=len(sizes)).tolist() if len(rows) else [0] * len(sizes)
    return sum(c * s for c, s in zip(counts, sizes))
