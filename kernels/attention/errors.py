"""Typed errors of the attention kernels."""
from __future__ import annotations

__all__ = ["AttentionError", "AttentionInputError", "FlexUnavailableError", "FlexEagerFallbackError"]


class AttentionError(RuntimeError):
    """Base class of attention failures."""


class AttentionInputError(AttentionError, ValueError):
    """Bad arguments: shapes, dtypes, devices, head counts, backend names."""


class FlexUnavailableError(AttentionError):
    """``backend="flex"`` was asked for where FlexAttention cannot run (no flex in this torch,
    backward or LSE on CPU, no Triton on CUDA)."""


class FlexEagerFallbackError(AttentionError):
    """FlexAttention was about to run uncompiled, which materializes the full S×S score matrix.

    Raised instead of taking that path silently (e.g. under ``TORCHDYNAMO_DISABLE=1`` or
    ``torch.compiler.disable``), and when the compiled call reaches Dynamo's recompile limit.
    Re-enable compilation (or raise the limit) or pass ``backend="sdpa"``.
    """
