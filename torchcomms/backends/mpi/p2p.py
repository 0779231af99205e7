"""What a point-to-point message carries besides its bytes, and the receiver's check of it.

MPI matches a receive to a message by source and tag only: a message shorter than the buffer
posted for it completes the receive with the rest of the buffer untouched, one of another dtype
of the same size is taken as is, and a longer one fails with ``MPI_ERR_TRUNCATE`` after Open MPI
(5.0.11 measured) has written it past the buffer's end whenever it went by rendezvous (a few KiB
and up, over shared memory with single copy or over TCP): the heap is corrupted and the process
dies later ("double free or corruption"). gloo's framed point-to-point (``gloo_p2p``) refuses
all three with ``CollectiveMismatchError``; so does this, and it never posts a buffer a message
could overflow. A send's MPI tag carries its dtype (``tag * TAG_STRIDE + code``); a receive
(:class:`ProbedRecv`) first takes its message with a matched probe (``MPI_Improbe``, any tag
from its source, so messages from one peer still match in program order), whose status gives
the tag and the byte count sent, and then receives it (``MPI_Imrecv``) into its buffer when
they are the buffer's, else into a scratch buffer of the message's size; once it completed,
:class:`Arrivals` raises the mismatch.
"""
from __future__ import annotations

from typing import Any

import torch

from torchcomms.backends.mpi.buffers import DTYPE_ORDER
from torchcomms.core.errors import CollectiveMismatchError

#: tags per torchcomms tag: one per dtype code
TAG_STRIDE = 16
_CODES = {d: i for i, d in enumerate(DTYPE_ORDER)}


def send_tag(tag: int, t: torch.Tensor) -> int:
    """The MPI tag of a send of ``t`` under torchcomms tag ``tag``."""
    return tag * TAG_STRIDE + _CODES[t.dtype]


def _describe(code: int, nbytes: int) -> str:
    if 0 <= code < len(DTYPE_ORDER):
        dt = DTYPE_ORDER[code]
        return f"{nbytes // dt.itemsize} elements of {dt}"
    return f"{nbytes} bytes of an unknown dtype"


def _message_of(MPI: Any, status: Any) -> tuple[int, int]:  # noqa: N803
    """The dtype code and byte count of the message ``status`` describes."""
    return status.Get_tag() % TAG_STRIDE, status.Get_count(MPI.BYTE)


def _fits(t: torch.Tensor, code: int, nbytes: int) -> bool:
    """Whether a message of dtype ``code`` and ``nbytes`` bytes is ``t``'s own."""
    return code == _CODES[t.dtype] and nbytes == t.numel() * t.element_size()


class ProbedRecv:
    """A receive as a request-like object (``Test(status=None)``, as ``MPI.Request`` has): each
    poll first tries to take its message with ``Improbe`` (once every receive in ``after``,
    those issued before it that a message of its source could match, took theirs), then
    receives it with the message's ``Irecv`` into ``tensor`` if the message is ``tensor``'s
    dtype and size, else into a scratch buffer of the message's own size; later polls test that
    receive. :attr:`request` is the MPI request once there is one."""

    __slots__ = ("MPI", "comm", "tensor", "src", "spec", "after", "request", "scratch")

    tensor: torch.Tensor | None

    def __init__(self, MPI: Any, comm: Any, tensor: torch.Tensor, src: int, spec: Any,  # noqa: N803
                 after: list[ProbedRecv]) -> None:
        self.MPI = MPI
        self.comm = comm
        self.tensor = tensor
        self.src = src  # MPI.ANY_SOURCE for a receive from any source
        self.spec = spec  # tensor -> MPI buffer spec
        self.after = after
        self.request: Any = None
        self.scratch: torch.Tensor | None = None  # a mismatched message's landing place

    @property
    def matched(self) -> bool:
        return self.request is not None

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI.Request's name
        if self.request is None and not self._match():
            return False
        if not self.request.Test(status):
            return False
        # complete: MPI no longer writes there, and the communicator keeps this receive (as its
        # source's latest) past the op, which must not keep the caller's buffer alive
        self.tensor = self.scratch = None
        return True

    def _match(self) -> bool:
        if self.after:
            if not all(before.matched for before in self.after):
                return False
            self.after = []
        probe = self.MPI.Status()
        message = self.comm.Improbe(self.src, self.MPI.ANY_TAG, probe)
        if message is None:
            return False
        code, nbytes = _message_of(self.MPI, probe)
        if _fits(self.tensor, code, nbytes):
            target = self.tensor
        else:
            dtype = DTYPE_ORDER[code] if code < len(DTYPE_ORDER) else torch.uint8
            if nbytes % dtype.itemsize:
                dtype = torch.uint8
            target = self.scratch = torch.empty(nbytes // dtype.itemsize, dtype=dtype)
        self.request = message.Irecv(self.spec(target))
        return True


def mpi_requests(requests: list[Any]) -> list[Any]:
    """The MPI requests behind ``requests`` (a :class:`ProbedRecv` that has not taken its
    message yet has none: MPI holds no buffer of it)."""
    out = []
    for r in requests:
        if isinstance(r, ProbedRecv):
            if r.request is not None:
                out.append(r.request)
        else:
            out.append(r)
    return out


class Arrivals:
    """The receives of one op (``(tensor, MPI.Status)`` each, the status filled by MPI) and the
    check that each got a message of its own dtype and size."""

    __slots__ = ("MPI", "recvs", "rank", "comm", "op")

    def __init__(self, MPI: Any, recvs: list[tuple[torch.Tensor, Any]], rank: int, comm: str,  # noqa: N803
                 op: str) -> None:
        self.MPI = MPI
        self.recvs = recvs
        self.rank = rank
        self.comm = comm
        self.op = op

    def _mismatch(self, t: torch.Tensor, status: Any) -> CollectiveMismatchError | None:
        code, nbytes = _message_of(self.MPI, status)
        if _fits(t, code, nbytes):
            return None
        src = status.Get_source()
        return CollectiveMismatchError(
            f"rank {src} sent {_describe(code, nbytes)} but rank {self.rank} posted a buffer for {t.numel()} "
            f"elements of {t.dtype}", comm=self.comm, op=self.op, ranks=[src, self.rank])

    def verify(self) -> None:
        """Raise ``CollectiveMismatchError`` for the first receive whose message was not its own."""
        for t, status in self.recvs:
            err = self._mismatch(t, status)
            if err is not None:
                raise err
