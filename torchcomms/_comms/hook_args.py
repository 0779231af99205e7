"""Typed hook arguments with the reference's names.

This project's hooks receive the op's :class:`torchcomms.OpRecord` (``pre_hook(name, op_id,
record)``, ``post_hook(op_id, record)``); code written for the reference's per-op argument
objects builds them from a record with :func:`pre_hook_args` (inside a pre-hook, while the
record still carries its tensors) or :func:`post_hook_args`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torchcomms.types import OpName


@dataclass(frozen=True)
class AllReducePreHookArgs:
    """``tensor`` and ``async_op`` in the reference's order; ``op`` (the reduction's label) is
    this project's addition, last so that positional construction keeps working."""

    tensor: torch.Tensor
    async_op: bool
    op: str | None = None


@dataclass(frozen=True)
class BroadcastPreHookArgs:
    tensor: torch.Tensor
    root: int
    async_op: bool


@dataclass(frozen=True)
class SendPreHookArgs:
    tensor: torch.Tensor
    peer: int
    async_op: bool


@dataclass(frozen=True)
class RecvPreHookArgs:
    tensor: torch.Tensor
    peer: int
    async_op: bool


@dataclass(frozen=True)
class CollectivePreHookArgs:
    """Any other op: its input and output tensors."""

    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    async_op: bool


@dataclass(frozen=True)
class OpPostHookArgs:
    """Every op's post-hook argument: how it ended."""

    name: str
    seq: int
    state: str
    error: str | None


@dataclass(frozen=True)
class AllReducePostHookArgs(OpPostHookArgs):
    """How an all_reduce ended (the post-hook type matching :class:`AllReducePreHookArgs`)."""


@dataclass(frozen=True)
class BroadcastPostHookArgs(OpPostHookArgs):
    """How a broadcast ended."""


@dataclass(frozen=True)
class SendPostHookArgs(OpPostHookArgs):
    """How a send ended."""


@dataclass(frozen=True)
class RecvPostHookArgs(OpPostHookArgs):
    """How a receive ended."""


_POST_TYPES: dict[str, type[OpPostHookArgs]] = {
    "all_reduce": AllReducePostHookArgs, "broadcast": BroadcastPostHookArgs,
    "send": SendPostHookArgs, "recv": RecvPostHookArgs,
}


def pre_hook_args(name: OpName, record: Any) -> Any:
    """The reference-style argument object for a pre-hook call ``(name, op_id, record)``."""
    extra = record.extra or {}
    inputs, outputs = extra.get("inputs", []), extra.get("outputs", [])
    first = (inputs or outputs or [None])[0]
    if name is OpName.all_reduce:
        return AllReducePreHookArgs(first, record.async_op, record.reduce_op)
    if name is OpName.broadcast:
        return BroadcastPreHookArgs(first, record.root, record.async_op)
    if name is OpName.send:
        return SendPreHookArgs(first, record.peer, record.async_op)
    if name is OpName.recv:
        return RecvPreHookArgs((outputs or inputs or [None])[0], record.peer, record.async_op)
    return CollectivePreHookArgs(list(inputs), list(outputs), record.async_op)


def post_hook_args(record: Any) -> OpPostHookArgs:
    """The post-hook argument object of the op of ``record``: the op's ``…PostHookArgs`` where the
    op has one, else :class:`OpPostHookArgs`."""
    name = str(record.name)
    return _POST_TYPES.get(name, OpPostHookArgs)(name, record.seq, record.state, record.error)
