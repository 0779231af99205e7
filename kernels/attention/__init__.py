"""FlexAttention masks and an attention function that picks the fastest correct kernel.

>>> from kernels.attention import attention, masks
>>> out = attention(q, k, v, masks.sliding_window(256))           # doctest: +SKIP
"""
from __future__ import annotations

from . import masks
from .block_mask import BlockMaskCache, default_cache, flex_available, get_block_mask
from .errors import AttentionError, AttentionInputError, FlexEagerFallbackError, FlexUnavailableError
from .functional import attention, select_backend
from .masks import Mask, MaskError
from .reference import math_attention

__all__ = [
    "attention",
    "select_backend",
    "math_attention",
    "masks",
    "Mask",
    "MaskError",
    "BlockMaskCache",
    "default_cache",
    "get_block_mask",
    "flex_available",
    "AttentionError",
    "AttentionInputError",
    "FlexUnavailableError",
    "FlexEagerFallbackError",
]


class _CallablePackage(type(masks)):  # type: ignore[misc]
    """Lets ``from kernels import attention; attention(q, k, v, mask)`` call the function while
    ``kernels.attention.masks`` and friends stay importable from the package."""

    def __call__(self, *args, **kwargs):
        return attention(*args, **kwargs)


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _CallablePackage
del _sys
