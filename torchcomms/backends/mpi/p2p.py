"""What a point-to-point message carries besides its bytes, and the receiver's check of it.

MPI matches a receive to a message by source and tag only: a message shorter than the buffer
posted for it completes the receive with the rest of the buffer untouched, one of another dtype
of the same size is taken as is, and a longer one fails with ``MPI_ERR_TRUNCATE``. gloo's framed
point-to-point (``gloo_p2p``) refuses all three with ``CollectiveMismatchError``; so does this.
A send's MPI tag carries its dtype (``tag * TAG_STRIDE + code``) and a receive takes any tag from
its source (so messages from one peer still match in program order); once it completed, its
``MPI.Status`` gives the tag and the byte count sent, which must be the buffer's.
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
        tag, nbytes = status.Get_tag(), status.Get_count(self.MPI.BYTE)
        code = tag % TAG_STRIDE
        if code == _CODES[t.dtype] and nbytes == t.numel() * t.element_size():
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

    def truncation(self, error: BaseException) -> CollectiveMismatchError | None:
        """The mismatch behind an MPI error of these receives (``MPI_ERR_TRUNCATE``: a message
        longer than its buffer), else ``None``. Of several requests, the truncated one's status
        holds the error; one request's own status does not."""
        MPI = self.MPI  # noqa: N806
        if not isinstance(error, MPI.Exception) or error.Get_error_class() not in (MPI.ERR_TRUNCATE,
                                                                                  MPI.ERR_IN_STATUS):
            return None
        for t, status in self.recvs:
            if status.Get_error() == MPI.ERR_TRUNCATE:
                return self._mismatch(t, status)
        if error.Get_error_class() == MPI.ERR_TRUNCATE and len(self.recvs) == 1:
            return self._mismatch(*self.recvs[0])
        return None
