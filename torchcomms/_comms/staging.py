"""Non-contiguous tensors of c10d's gathering and scattering ops, run through contiguous copies.

c10d's gloo gathers into, and reads from, views that are not contiguous (``out.chunk(n, dim=1)``
as ``all_gather``'s outputs, a column as its input) and gets them right, as it copies each piece
into place. The communicator refuses such tensors, so the forwarder gives it contiguous copies
instead: inputs are copied before the op, outputs are copied back into the caller's tensors once
the op succeeded (:class:`StagedWork`). An output with a stride of 0 (several elements in one
place) is left as it is, for the communicator to refuse: nothing could be copied back into it.
An input with one (an expanded tensor) is copied like any other view: refused on the ranks that
have it only, it left the others waiting in the op until the timeout. Which tensors of which
ops: ``forward.py`` (docs/INTERNALS.md, "The torch.distributed route").
"""
from __future__ import annotations

import threading
from typing import Any

import torch


def _copyable(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and not t.is_contiguous()


def _stageable(t: torch.Tensor) -> bool:
    return _copyable(t) and not any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape))


def staged_input(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a contiguous copy of it (of an expanded view too)."""
    return t.contiguous() if _copyable(t) else t


def staged_output(t: torch.Tensor, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """``t``, or a contiguous buffer of its shape that is copied back into ``t`` (noted in ``pairs``)."""
    if not _stageable(t):
        return t
    buf = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    pairs.append((t, buf))
    return buf


class StagedWork:
    """``work``, whose outputs in ``pairs`` (caller's tensor, buffer) are copied back once it
    succeeded: on the first ``wait()`` or ``is_completed()`` that sees it end (c10d's future
    completes through ``wait()``)."""

    def __init__(self, work: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.work = work
        self._pairs = pairs
        self._lock = threading.Lock()

    def _copy_back(self) -> None:
        with self._lock:
            if self._pairs and self.work.is_success():
                for dst, buf in self._pairs:
                    dst.copy_(buf.view(dst.shape))
                self._pairs = []

    def wait(self, timeout: float | None = None) -> bool:
        done = self.work.wait() if timeout is None else self.work.wait(timeout)
        if done is not False:
            self._copy_back()
        return done

    def is_completed(self) -> bool:
        done = self.work.is_completed()
        if done:
            self._copy_back()
        return done

    def is_success(self) -> bool:
        return self.work.is_success()

    def exception(self) -> BaseException | None:
        return self.work.exception()

    def source_rank(self) -> int:
        return self.work.source_rank()


def staged(work: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """``work`` itself when nothing was staged, else a :class:`StagedWork`."""
    return StagedWork(work, pairs) if pairs else work
