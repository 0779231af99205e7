"""Point-to-point on gloo, framed: every send is preceded by a 32-byte header (dtype, element
count, byte count) on the same pair and tag, and a receive takes the header first.

Gloo itself aborts the receiving process in C++ when a message is longer than the buffer posted
for it ("Received data size doesn't match expected size"), and silently accepts a shorter one or
one of another dtype. With the header, the receiver compares before it posts its buffer: on a
match the payload lands in the user's tensor; otherwise the payload is drained into a scratch
buffer of exactly its size (the pair stays in step) and the receive fails with
``CollectiveMismatchError`` naming both sides. Receives from one peer post their headers in
program order (each waits until the one before it has posted its payload buffer), so gloo's
in-order matching pairs every header and payload with the right receive.
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from torchcomms.core.errors import CollectiveMismatchError

HEADER_WORDS = 4
_MAGIC = 0x7C0DD1
_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
           torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)
_CODES = {d: i for i, d in enumerate(_DTYPES)}


def header_of(t: torch.Tensor) -> torch.Tensor:
    """The header announcing ``t``: magic, dtype code, element count, byte count."""
    return torch.tensor([_MAGIC, _CODES.get(t.dtype, -1), t.numel(), t.numel() * t.element_size()],
                        dtype=torch.int64)


def _describe(code: int, numel: int) -> str:
    dtype = _DTYPES[code] if 0 <= code < len(_DTYPES) else "an unknown dtype"
    return f"{numel} elements of {dtype}"


class FramedSend:
    """A send's header and payload works; ``wait()`` waits for both."""

    def __init__(self, pg: Any, tensor: torch.Tensor, dst: int, tag: int) -> None:
        self._header = header_of(tensor)  # kept alive until sent
        self._works = [pg.send([self._header], dst, tag), pg.send([tensor], dst, tag)]

    def wait(self) -> None:
        for w in self._works:
            w.wait()


class FramedRecv:
    """A receive: header, comparison, then the payload into ``tensor`` (or drained on a
    mismatch, then :class:`CollectiveMismatchError`). ``wait()`` runs it all on the caller's
    thread; ``after`` is the previous receive from the same peer (its payload buffer must be
    posted first); :attr:`posted` is set once this one's payload buffer is."""

    def __init__(self, pg: Any, tensor: torch.Tensor, src: int, tag: int, rank: int,
                 after: FramedRecv | None) -> None:
        self._pg, self._tensor, self._src, self._tag, self._rank = pg, tensor, src, tag, rank
        self._after = after
        self.posted = threading.Event()

    def wait(self) -> None:
        mismatch = ""
        try:
            if self._after is not None:
                self._after.posted.wait()
                self._after = None
            header = torch.empty(HEADER_WORDS, dtype=torch.int64)
            self._pg.recv([header], self._src, self._tag).wait()
            magic, code, numel, nbytes = header.tolist()
            t = self._tensor
            if magic != _MAGIC:
                raise CollectiveMismatchError(
                    f"recv from rank {self._src}: it sent a message without a torchcomms header",
                    ranks=[self._src, self._rank])
            if code != _CODES.get(t.dtype, -2) or numel != t.numel():
                mismatch = (f"recv: rank {self._src} sent {_describe(code, numel)} but rank {self._rank} "
                            f"posted a buffer for {t.numel()} elements of {t.dtype}")
                target = torch.empty(nbytes, dtype=torch.uint8)
            else:
                target = t
            work = self._pg.recv([target], self._src, self._tag)
        finally:
            self.posted.set()
        work.wait()
        if mismatch:
            raise CollectiveMismatchError(mismatch, ranks=sorted({self._src, self._rank}))
