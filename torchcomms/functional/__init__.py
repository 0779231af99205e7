"""Functional collectives on a communicator, as ``torchcomms::*`` torch custom ops.

``all_reduce(t, op, comm)`` returns a new tensor (the input is not modified); so do
``all_gather_single``, ``reduce_scatter_single`` and ``all_to_all_single``. Each is a custom op in
the ``torchcomms`` ``torch.library`` namespace with a fake (meta) implementation, so
``torch.compile(fullgraph=True)`` traces through them on CPU and CUDA; the op runs the
communicator's collective synchronously (its deadline and typed errors apply). Autograd: the
gradient of a SUM all_reduce is a SUM all_reduce; all_gather_single and reduce_scatter_single
(SUM) are each other's gradient.

Ops name their communicator by ``comm.get_name()``: a communicator is registered the first time
it is used eagerly, or with :func:`register_comm` (do that before the first compiled call).
With ``async_op=True`` a function returns a :class:`TorchCommsAsyncTensor`; ``wait()`` gives the
result.
"""
from __future__ import annotations

import os
import weakref
from typing import Any

import torch

from torchcomms.functional.async_tensor import TorchCommsAsyncTensor
from torchcomms.functional import ops as _ops  # registers torch.ops.torchcomms.*

__all__ = [
    "all_reduce", "all_gather_single", "reduce_scatter_single", "all_to_all_single", "register_comm",
    "is_torch_compile_supported", "is_torch_compile_supported_and_enabled", "TorchCommsAsyncTensor",
]

_REGISTRY: "weakref.WeakValueDictionary[str, Any]" = _ops.COMMS


def register_comm(comm: Any) -> str:
    """Make ``comm`` reachable from the ops (by its name); returns the name."""
    name = comm.get_name()
    _REGISTRY[name] = comm
    return name


def _name(comm: Any) -> str:
    if not torch.compiler.is_compiling():
        return register_comm(comm)
    return comm.get_name()


def _op_label(op: Any) -> str:
    label = getattr(op, "label", None)
    return str(label if label is not None else op).lower()


def _result(t: torch.Tensor, async_op: bool) -> torch.Tensor:
    return TorchCommsAsyncTensor(t) if async_op else t


def all_reduce(tensor: torch.Tensor, op: Any, comm: Any, async_op: bool = False) -> torch.Tensor:
    """The reduction of ``tensor`` over ``comm`` (``op``: a :class:`torchcomms.ReduceOp` or its name)."""
    return _result(torch.ops.torchcomms.all_reduce(tensor, _name(comm), _op_label(op)), async_op)


def all_gather_single(tensor: torch.Tensor, comm: Any, async_op: bool = False) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dim 0, in rank order."""
    return _result(torch.ops.torchcomms.all_gather_single(tensor, _name(comm)), async_op)


def reduce_scatter_single(tensor: torch.Tensor, op: Any, comm: Any, async_op: bool = False) -> torch.Tensor:
    """This rank's dim-0 block of the reduction of ``tensor`` (dim 0 divisible by the size)."""
    return _result(torch.ops.torchcomms.reduce_scatter_single(tensor, _name(comm), _op_label(op)), async_op)


def all_to_all_single(tensor: torch.Tensor, comm: Any, async_op: bool = False) -> torch.Tensor:
    """Block ``p`` of dim 0 goes to rank ``p``; the result holds block ``rank`` of every rank."""
    return _result(torch.ops.torchcomms.all_to_all_single(tensor, _name(comm)), async_op)


def _version_tuple(v: str) -> tuple[int, ...]:
    from torch.torch_version import TorchVersion

    return TorchVersion(v)  # type: ignore[return-value]


def is_torch_compile_supported(min_version: str = "2.12.0.dev0") -> bool:
    """True when torch is at least ``min_version`` (or
    ``TORCHCOMMS_COMPILE_IGNORE_PYTORCH_VERSION_REQUIREMENT=1``)."""
    if os.environ.get("TORCHCOMMS_COMPILE_IGNORE_PYTORCH_VERSION_REQUIREMENT") == "1":
        return True
    from torch.torch_version import TorchVersion

    return TorchVersion(torch.__version__) >= min_version


def is_torch_compile_supported_and_enabled(min_version: str = "2.12.0.dev0") -> bool:
    """:func:`is_torch_compile_supported` and ``TORCHCOMMS_PATCH_FOR_COMPILE=1``."""
    return is_torch_compile_supported(min_version) and os.environ.get("TORCHCOMMS_PATCH_FOR_COMPILE") == "1"
