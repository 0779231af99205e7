"""Point-to-point on gloo, framed: every message starts with a 32-byte header (dtype, element
count, byte count) on the same pair and tag, and a receive reads the header before anything
lands in the user's tensor.

Gloo itself aborts the receiving process in C++ when a message is longer than the buffer posted
for it ("Received data size doesn't match expected size"), and silently accepts a shorter one or
one of another dtype. So a receive first posts a buffer of :data:`FIRST_FRAME_BYTES`, which no
first frame exceeds: the header, then the first :data:`INLINE_BYTES` of the payload. A message
of at most that size is one frame, received as soon as it arrives (no round of its own for the
header); the rest of a longer one follows as a second frame, which the receiver posts once the
header told it the exact size. On a match the payload lands in the user's tensor; otherwise what
is left of it is drained into a scratch buffer of exactly its size (the pair stays in step) and
the receive fails with ``CollectiveMismatchError`` naming both sides. Receives from one peer post
in program order (each after the one before it posted all of its frames), so gloo's in-order
matching pairs every frame with the right receive.

In the check mode (``confirm``: ``TORCHCOMM_CHECK_COLLECTIVES=1``) the first frame is the header
alone: the receiver answers it with its own header, on a tag of its own, and the sender sends
its payload (the second frame, whole) only once the answer matches: on a mismatch both sides
raise, and no payload moves. That costs the sender a round trip per message; sends to one peer
are then posted in program order like receives.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from torchcomms.core.errors import CollectiveMismatchError

HEADER_WORDS = 4
HEADER_BYTES = HEADER_WORDS * 8
#: payload bytes carried in the first frame, behind the header (outside the check mode)
INLINE_BYTES = 64 * 1024
FIRST_FRAME_BYTES = HEADER_BYTES + INLINE_BYTES
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


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory as a flat ``uint8`` view (``t`` is contiguous: validation ensures it)."""
    return t.reshape(-1).view(torch.uint8)


class FramedSend:
    """A send: its first frame (header, then up to :data:`INLINE_BYTES` of payload), then the
    rest of the payload if any. In the check mode the first frame is the header alone and the
    payload follows, whole, once the receiver's answer matched. ``wait()`` waits for all of
    it; ``after``/``posted`` order the sends to one peer in the check mode, as for
    :class:`FramedRecv`."""

    def __init__(self, pg: Any, tensor: torch.Tensor, dst: int, tag: int, rank: int,
                 confirm: bool = False, after: FramedSend | None = None) -> None:
        self._pg, self._tensor, self._dst, self._tag, self._rank = pg, tensor, dst, tag, rank
        self._header = header_of(tensor)  # kept alive until sent
        self._after = after
        self.posted = threading.Event()
        self._works: list[Any] = []
        self._confirm = confirm
        if not confirm:
            payload = _bytes(tensor)
            first = torch.empty(HEADER_BYTES + min(payload.numel(), INLINE_BYTES), dtype=torch.uint8)
            first[:HEADER_BYTES] = self._header.view(torch.uint8)
            first[HEADER_BYTES:] = payload[:INLINE_BYTES]
            self._works = [pg.send([first], dst, tag)]  # the work keeps ``first`` alive until sent
            if payload.numel() > INLINE_BYTES:
                self._works.append(pg.send([payload[INLINE_BYTES:]], dst, tag))
            self.posted.set()

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
    """A receive: the first frame (into a buffer of :data:`FIRST_FRAME_BYTES`), the comparison
    of its header with ``tensor``, then the payload into ``tensor`` (the first frame's part
    copied, the rest received in place), or drained on a mismatch, then
    :class:`CollectiveMismatchError`. ``after`` are the receives that must have posted all of
    their frames first (the previous receive from the same peer; for a receive from any source,
    the last one from every peer): when they have, the first frame is posted as the receive is
    made, else by ``wait()``, which runs the rest on the caller's thread. :attr:`posted` is set
    once this receive's last frame is posted.

    With ``src=None`` it receives from any source: the first frame is taken with gloo's
    ``recv_anysource``, ``found(sender)`` is called as soon as it arrived, and the rest is
    then taken from that sender. The engine orders every later receive after this one (see
    ``GlooBackend.recv_any_source``), so no other first-frame receive is posted meanwhile.
    """

    def __init__(self, pg: Any, tensor: torch.Tensor, src: int | None, tag: int, rank: int,
                 after: list[FramedRecv], confirm: bool = False,
                 found: Callable[[int], None] | None = None) -> None:
        self._pg, self._tensor, self._src, self._tag, self._rank = pg, tensor, src, tag, rank
        self._confirm = confirm
        self._after = after
        self._found = found
        self.posted = threading.Event()
        self._first: torch.Tensor | None = None
        self._first_work: Any = None
        if all(before.posted.is_set() for before in after):
            self._post_first()

    def _post_first(self) -> None:
        self._after = []
        self._first = torch.empty(FIRST_FRAME_BYTES, dtype=torch.uint8)
        if self._src is not None:
            self._first_work = self._pg.recv([self._first], self._src, self._tag)
        else:
            self._first_work = self._pg.recv_anysource([self._first], self._tag)

    def _header(self) -> list[int]:
        if self._first_work is None:
            for before in self._after:
                before.posted.wait()
            self._post_first()
        self._first_work.wait()
        if self._src is None:
            self._src = int(self._first_work._source_rank())
            if self._found is not None:
                self._found(self._src)
        self._first_work = None
        assert self._first is not None
        return self._first[:HEADER_BYTES].view(torch.int64).tolist()

    def wait(self) -> None:
        mismatch = ""
        rest_work = None
        try:
            magic, code, numel, nbytes = self._header()
            src = self._src
            assert src is not None and self._first is not None
            t = self._tensor
            if magic != _MAGIC:
                raise CollectiveMismatchError(
                    f"recv from rank {src}: it sent a message without a torchcomms header",
                    ranks=[src, self._rank])
            if self._confirm:  # the sender waits for this answer before its payload
                self._pg.send([header_of(t)], src, self._tag + REPLY_TAG_OFFSET).wait()
            inline = 0 if self._confirm else min(nbytes, INLINE_BYTES)
            target: torch.Tensor | None
            if not _fits([magic, code, numel], t):
                mismatch = f"recv: {_mismatch(src, [magic, code, numel], self._rank, t)}"
                # drain what follows (in the check mode the sender sends no payload)
                target = torch.empty(nbytes - inline, dtype=torch.uint8) if not self._confirm else None
            else:
                payload = _bytes(t)
                if inline:
                    payload[:inline].copy_(self._first[HEADER_BYTES:HEADER_BYTES + inline])
                target = payload[inline:]
            self._first = None
            if target is not None and (self._confirm or target.numel() > 0):
                rest_work = self._pg.recv([target], src, self._tag)
        finally:
            self.posted.set()
        if rest_work is not None:
            rest_work.wait()
        if mismatch:
            raise CollectiveMismatchError(mismatch, ranks=sorted({src, self._rank}))
