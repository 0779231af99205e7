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

In the check mode (``confirm``: ``TORCHCOMM_CHECK_COLLECTIVES=1``) the receiver also answers
each header with its own, on a tag of its own, and the sender sends its payload only once the
answer matches: on a mismatch both sides raise, and no payload moves. That costs the sender a
round trip per message; sends to one peer are then posted in program order like receives.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from torchcomms.core.errors import CollectiveMismatchError

HEADER_WORDS = 4
REPLY_TAG_OFFSET = 1 << 20  # the check mode's answers travel on tag + this
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


def _mismatch(sender: int, sent: list[int], receiver: int, expected: torch.Tensor) -> str:
    return (f"rank {sender} sent {_describe(sent[1], sent[2])} but rank {receiver} posted a buffer "
            f"for {expected.numel()} elements of {expected.dtype}")


def _fits(header: list[int], t: torch.Tensor) -> bool:
    return header[1] == _CODES.get(t.dtype, -2) and header[2] == t.numel()


class FramedSend:
    """A send: its header, then (in the check mode, once the receiver's answer matched) its
    payload. ``wait()`` waits for all of it; ``after``/``posted`` order the sends to one peer
    in the check mode, as for :class:`FramedRecv`."""

    def __init__(self, pg: Any, tensor: torch.Tensor, dst: int, tag: int, rank: int,
                 confirm: bool = False, after: FramedSend | None = None) -> None:
        self._pg, self._tensor, self._dst, self._tag, self._rank = pg, tensor, dst, tag, rank
        self._header = header_of(tensor)  # kept alive until sent
        self._after = after
        self.posted = threading.Event()
        self._works: list[Any] = []
        if not confirm:
            self._works = [pg.send([self._header], dst, tag), pg.send([tensor], dst, tag)]
            self.posted.set()
        self._confirm = confirm

    def wait(self) -> None:
        if self._confirm:
            self._confirmed_send()
        for w in self._works:
            w.wait()

    def _confirmed_send(self) -> None:
        answer = torch.empty(HEADER_WORDS, dtype=torch.int64)
        try:
            if self._after is not None:
                self._after.posted.wait()
                self._after = None
            sent = self._pg.send([self._header], self._dst, self._tag)
            self._pg.recv([answer], self._dst, self._tag + REPLY_TAG_OFFSET).wait()
            theirs = answer.tolist()
            ok = theirs[0] == _MAGIC and theirs[1] == self._header[1].item() and theirs[2] == self._tensor.numel()
            if ok:
                self._works = [sent, self._pg.send([self._tensor], self._dst, self._tag)]
        finally:
            self.posted.set()
        if not ok:
            sent.wait()
            raise CollectiveMismatchError(
                f"send: rank {self._rank} sent {_describe(int(self._header[1]), self._tensor.numel())} but "
                f"rank {self._dst} posted a buffer for {_describe(theirs[1], theirs[2])}",
                ranks=sorted({self._rank, self._dst}))


class FramedRecv:
    """A receive: header, comparison, then the payload into ``tensor`` (or drained on a
    mismatch, then :class:`CollectiveMismatchError`). ``wait()`` runs it all on the caller's
    thread; ``after`` are the receives whose payload buffers must be posted first (the previous
    receive from the same peer; for a receive from any source, the last one from every peer);
    :attr:`posted` is set once this one's payload buffer is.

    With ``src=None`` it receives from any source: the header is taken with gloo's
    ``recv_anysource``, ``found(sender)`` is called as soon as it arrived, and the payload is
    then taken from that sender. The engine orders every later receive after this one (see
    ``GlooBackend.recv_any_source``), so no other header receive is posted meanwhile.
    """

    def __init__(self, pg: Any, tensor: torch.Tensor, src: int | None, tag: int, rank: int,
                 after: list[FramedRecv], confirm: bool = False,
                 found: Callable[[int], None] | None = None) -> None:
        self._pg, self._tensor, self._src, self._tag, self._rank = pg, tensor, src, tag, rank
        self._confirm = confirm
        self._after = after
        self._found = found
        self.posted = threading.Event()

    def _header(self) -> torch.Tensor:
        header = torch.empty(HEADER_WORDS, dtype=torch.int64)
        if self._src is not None:
            self._pg.recv([header], self._src, self._tag).wait()
            return header
        work = self._pg.recv_anysource([header], self._tag)
        work.wait()
        self._src = int(work._source_rank())
        if self._found is not None:
            self._found(self._src)
        return header

    def wait(self) -> None:
        mismatch = ""
        try:
            for before in self._after:
                before.posted.wait()
            self._after = []
            header = self._header()
            src = self._src
            assert src is not None
            magic, code, numel, nbytes = header.tolist()
            t = self._tensor
            if magic != _MAGIC:
                raise CollectiveMismatchError(
                    f"recv from rank {src}: it sent a message without a torchcomms header",
                    ranks=[src, self._rank])
            if self._confirm:  # the sender waits for this answer before its payload
                self._pg.send([header_of(t)], src, self._tag + REPLY_TAG_OFFSET).wait()
            if not _fits([magic, code, numel], t):
                mismatch = f"recv: {_mismatch(src, [magic, code, numel], self._rank, t)}"
                target = torch.empty(nbytes, dtype=torch.uint8)
            else:
                target = t
            if mismatch and self._confirm:
                work = None  # the sender sends no payload
            else:
                work = self._pg.recv([target], src, self._tag)
        finally:
            self.posted.set()
        if work is not None:
            work.wait()
        if mismatch:
            raise CollectiveMismatchError(mismatch, ranks=sorted({src, self._rank}))
