"""The memory a communicator's asynchronous ops in flight read and write, so that a later op on
the same memory runs after them, in the order the caller issued the two.

On a CUDA engine two ops on one tensor are ordered by the stream they are issued on; gloo runs a
communicator's ops on several threads of its own and MPI's nonblocking collectives may progress
together, so there a second all-reduce of a tensor whose first is still in flight read and wrote
it at the same time as the first (wrong sums in most of 200 tries, on c10d's gloo as on ours).
An op whose memory meets that of an op in flight (one of them writes it) therefore waits, on the
caller's thread and within its own deadline, until that op ended, before its hooks see its data
and before the engine does. Ops that only read the same memory (two sends of one tensor) do not
wait for each other, nor do two point-to-point ops: a send completes only once its peer's
receive is posted, so a receive into the buffer of a send still in flight (wrong in MPI's terms,
and a deadlock on a CUDA stream) would wait for a send whose peer waits the same way.

Only asynchronous ops are entered: a synchronous op has ended when its call returns. Spans are
byte ranges of the tensors' data; the tensors themselves are never kept.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import torch

from torchcomms.core.errors import CommError, CommTimeoutError

if TYPE_CHECKING:
    from torchcomms.core.op import OpRecord
    from torchcomms.core.work import TorchWork

Span = tuple[int, int]  # [first byte, past the last byte)


def spans(tensors: list[torch.Tensor]) -> tuple[Span, ...]:
    """The byte ranges ``tensors`` occupy (a strided view: from its lowest to its highest
    element). Tensors without strided host or device memory of their own (sparse, meta, empty)
    have none."""
    out = []
    for t in tensors:
        if t.layout is not torch.strided or t.is_meta:
            continue
        n = t.numel()
        if n == 0:
            continue
        size = t.element_size()
        start = t.data_ptr()
        if t.is_contiguous():
            out.append((start, start + n * size))
            continue
        low = high = 0
        for extent, stride in zip(t.shape, t.stride()):
            if stride >= 0:
                high += (extent - 1) * stride
            else:
                low += (extent - 1) * stride
        out.append((start + low * size, start + (high + 1) * size))
    return tuple(out)


def _meet(a: tuple[Span, ...], b: tuple[Span, ...]) -> bool:
    return any(x0 < y1 and y0 < x1 for x0, x1 in a for y0, y1 in b)


class BusyMemory:
    """The spans each asynchronous op in flight reads and writes (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: op in flight -> (spans it reads, spans it writes, whether it is point-to-point)
        self.ops: dict[TorchWork, tuple[tuple[Span, ...], tuple[Span, ...], bool]] = {}

    def claim(self, work: TorchWork, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
              p2p: bool = False) -> None:
        """Enter ``work`` (not yet given to the engine) with the memory it reads and writes."""
        writes = spans(outputs)
        reads = writes if outputs is inputs else spans(inputs)
        with self._lock:
            self.ops[work] = (reads, writes, p2p)

    def release(self, work: TorchWork) -> None:
        """``work`` ended: its memory is free for later ops."""
        with self._lock:
            self.ops.pop(work, None)

    def conflicts(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
                  p2p: bool = False) -> list[TorchWork]:
        """The ops in flight whose memory an op reading ``inputs`` and writing ``outputs`` meets
        where one of the two writes, in the order they were entered (for a point-to-point op,
        the collectives among them)."""
        writes = spans(outputs)
        reads = writes if outputs is inputs else spans(inputs)
        with self._lock:
            entries = list(self.ops.items())
        return [work for work, (their_reads, their_writes, their_p2p) in entries
                if not (p2p and their_p2p)
                and (_meet(writes, their_reads) or _meet(writes, their_writes) or _meet(reads, their_writes))]

    def wait_for_conflicts(self, rec: OpRecord, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
                           deadline: float) -> CommTimeoutError | None:
        """Wait until every op in flight whose memory this op meets has ended, or until
        ``deadline`` (``time.monotonic()``): then the error this op ends with. An earlier op's
        own failure is its own to report (its ``wait()``): this op goes on, and meets the
        communicator's state like any later op."""
        for earlier in self.conflicts(inputs, outputs, rec.is_p2p):
            remaining = deadline - time.monotonic()
            try:
                ended = remaining > 0 and earlier.wait_blocking(remaining)
            except CommError:
                continue
            if not ended and not earlier.done:
                er = earlier.record
                return CommTimeoutError(
                    f"did not start within {rec.timeout_s:g} s: it waited for {er.name} #{er.seq} of this "
                    f"communicator, still in flight on the same memory, to end",
                    timeout_s=rec.timeout_s, comm=rec.comm_name, op=str(rec.name), seq=rec.seq)
        return None
