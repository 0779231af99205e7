"""Compiled, cached FlexAttention ``BlockMask`` creation.

A training step calls attention once per layer with the same mask and shapes; building the
block mask once and reusing it is most of the win. :class:`BlockMaskCache` keys block masks by
(mask pattern, batch, heads, q_len, kv_len, device, block size) and evicts least-recently used
entries. :func:`get_block_mask` uses the process-wide cache.
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Any

import torch

from .errors import AttentionInputError, FlexUnavailableError
from .masks import Mask

__all__ = ["BlockMaskCache", "get_block_mask", "default_cache", "flex_available"]

try:  # torch >= 2.5
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask
    _FLEX_IMPORT_ERROR: Exception | None = None
except Exception as exc:  # pragma: no cover - older torch
    BlockMask = Any  # type: ignore[misc,assignment]
    create_block_mask = None  # type: ignore[assignment]
    _FLEX_IMPORT_ERROR = exc


def flex_available() -> bool:
    """Whether this torch ships FlexAttention."""
    return _FLEX_IMPORT_ERROR is None


def _normalize_block_size(block_size: int | tuple[int, int]) -> tuple[int, int]:
    if isinstance(block_size, int) and not isinstance(block_size, bool):
        pair = (block_size, block_size)
    elif (isinstance(block_size, tuple) and len(block_size) == 2
          and all(isinstance(x, int) and not isinstance(x, bool) for x in block_size)):
        pair = block_size
    else:
        raise AttentionInputError(f"block_size must be an int or a pair of ints, got {block_size!r}")
    for x in pair:
        if x < 16 or x & (x - 1):
            raise AttentionInputError(f"block_size entries must be powers of two >= 16, got {block_size!r}")
    return pair


class BlockMaskCache:
    """LRU cache of block masks keyed by pattern, shapes, device and block size.

    ``compile=True`` builds block masks with ``create_block_mask(..., _compile=True)``: slow
    the first time per shape, then far faster than the eager build at long sequence lengths.
    """

    def __init__(self, max_entries: int = 64, *, compile: bool | None = None) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise AttentionInputError(f"max_entries must be an int >= 1, got {max_entries!r}")
        self.max_entries = max_entries
        self.compile = compile
        self._entries: OrderedDict[tuple, BlockMask] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def get(
        self,
        mask: Mask,
        batch: int,
        heads: int,
        q_len: int,
        kv_len: int,
        device: torch.device | str,
        block_size: int | tuple[int, int] = 128,
    ) -> BlockMask:
        """The block mask of ``mask`` for this problem, built on first use."""
        if not flex_available():
            raise FlexUnavailableError(f"FlexAttention is not available in torch {torch.__version__}: "
                                       f"{_FLEX_IMPORT_ERROR}")
        if not isinstance(mask, Mask):
            raise AttentionInputError(f"mask must be a kernels.attention.masks.Mask, got {type(mask).__name__}")
        for name, v in (("batch", batch), ("heads", heads), ("q_len", q_len), ("kv_len", kv_len)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise AttentionInputError(f"{name} must be a positive int, got {v!r}")
        mask.check_shape(batch, q_len, kv_len)
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        bs = _normalize_block_size(block_size)
        b = batch if mask.batch_dependent else None
        h = heads if mask.head_dependent else None
        key = (mask.key, b, h, q_len, kv_len, str(device), bs)
        if torch.compiler.is_compiling():
            # traced: a cached mask enters the graph as an input (Dynamo guards on the entry); a
            # missing one is built inside the graph, on every call, and not cached (a traced
            # value must not outlive its graph). Build it eagerly first to avoid that cost.
            hit = self._entries.get(key)
            return hit if hit is not None else _build(mask, b, h, q_len, kv_len, device, bs, compile=False)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return hit
        use_compile = self.compile if self.compile is not None else device.type == "cuda"
        bm = _build(mask, b, h, q_len, kv_len, device, bs, compile=use_compile)
        with self._lock:
            self.misses += 1
            self._entries[key] = bm
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return bm


def _build(mask: Mask, b: int | None, h: int | None, q_len: int, kv_len: int, device: torch.device,
           block_size: tuple[int, int], *, compile: bool) -> BlockMask:
    """``create_block_mask`` for ``mask`` on ``device`` (``compile``: its compiled build)."""
    build = _compiled_create_block_mask() if compile else create_block_mask
    return build(mask.to(device).as_mask_mod(), b, h, q_len, kv_len, device=device, BLOCK_SIZE=block_size)


@functools.cache
def _compiled_create_block_mask() -> Any:
    """``torch.compile(create_block_mask)``, made once (``create_block_mask``'s ``_compile``
    flag does the same per call, is deprecated and warns on torch 2.11)."""
    return torch.compile(create_block_mask)


default_cache = BlockMaskCache()


def get_block_mask(mask: Mask, batch: int, heads: int, q_len: int, kv_len: int,
                   device: torch.device | str, block_size: int | tuple[int, int] = 128) -> BlockMask:
    """Block mask from the process-wide cache (see :class:`BlockMaskCache`)."""
    return default_cache.get(mask, batch, heads, q_len, kv_len, device, block_size)
