"""The ``torchcomms::*`` custom ops behind :mod:`torchcomms.functional` (eager, fake, autograd)."""
from __future__ import annotations

import weakref
from typing import Any

import torch

from torchcomms.types import ReduceOp, RedOpType

#: communicator name -> communicator (registered by torchcomms.functional)
COMMS: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()


def _comm(name: str) -> Any:
    comm = COMMS.get(name)
    if comm is None:
        raise LookupError(f"torchcomms.functional: no communicator named {name!r} is registered "
                          "(call torchcomms.functional.register_comm(comm) first)")
    return comm


def _reduce_op(label: str) -> ReduceOp:
    try:
        return getattr(ReduceOp, RedOpType(label).name)
    except (ValueError, AttributeError):
        raise ValueError(f"torchcomms.functional: unknown reduce op {label!r}") from None


@torch.library.custom_op("torchcomms::all_reduce", mutates_args=())
def all_reduce(tensor: torch.Tensor, comm_name: str, op: str) -> torch.Tensor:
    out = tensor.clone(memory_format=torch.contiguous_format)
    _comm(comm_name).all_reduce(out, _reduce_op(op), False)
    return out


@all_reduce.register_fake
def _(tensor: torch.Tensor, comm_name: str, op: str) -> torch.Tensor:
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


@torch.library.custom_op("torchcomms::all_gather_single", mutates_args=())
def all_gather_single(tensor: torch.Tensor, comm_name: str) -> torch.Tensor:
    comm = _comm(comm_name)
    inp = tensor.contiguous()
    out = inp.new_empty((comm.get_size() * inp.shape[0], *inp.shape[1:]))
    comm.all_gather_single(out, inp, False)
    return out


@torch.library.register_fake("torchcomms::all_gather_single")
def _(tensor: torch.Tensor, comm_name: str) -> torch.Tensor:
    size = _comm(comm_name).get_size()
    return tensor.new_empty((size * tensor.shape[0], *tensor.shape[1:]))


@torch.library.custom_op("torchcomms::reduce_scatter_single", mutates_args=())
def reduce_scatter_single(tensor: torch.Tensor, comm_name: str, op: str) -> torch.Tensor:
    comm = _comm(comm_name)
    inp = tensor.contiguous()
    n = comm.get_size()
    if inp.shape[0] % n:
        raise ValueError(f"torchcomms.functional.reduce_scatter_single: dim 0 ({inp.shape[0]}) is not divisible by "
                         f"the communicator size {n}")
    out = inp.new_empty((inp.shape[0] // n, *inp.shape[1:]))
    comm.reduce_scatter_single(out, inp, _reduce_op(op), False)
    return out


@torch.library.register_fake("torchcomms::reduce_scatter_single")
def _(tensor: torch.Tensor, comm_name: str, op: str) -> torch.Tensor:
    size = _comm(comm_name).get_size()
    return tensor.new_empty((tensor.shape[0] // size, *tensor.shape[1:]))


@torch.library.custom_op("torchcomms::all_to_all_single", mutates_args=())
def all_to_all_single(tensor: torch.Tensor, comm_name: str) -> torch.Tensor:
    inp = tensor.contiguous()
    out = torch.empty_like(inp)
    _comm(comm_name).all_to_all_single(out, inp, False)
    return out


@all_to_all_single.register_fake
def _(tensor: torch.Tensor, comm_name: str) -> torch.Tensor:
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


# --- autograd ----------------------------------------------------------------------------------
def _setup_name(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.comm_name = inputs[1]
    ctx.op = inputs[2] if len(inputs) > 2 else "sum"


def _all_reduce_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    if ctx.op not in ("sum", "avg"):
        raise RuntimeError(f"torchcomms.functional.all_reduce: no gradient for reduce op {ctx.op!r}")
    return torch.ops.torchcomms.all_reduce(grad, ctx.comm_name, ctx.op), None, None


def _all_gather_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    return torch.ops.torchcomms.reduce_scatter_single(grad, ctx.comm_name, "sum"), None


def _reduce_scatter_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    if ctx.op != "sum":
        raise RuntimeError(f"torchcomms.functional.reduce_scatter_single: no gradient for reduce op {ctx.op!r}")
    return torch.ops.torchcomms.all_gather_single(grad, ctx.comm_name), None, None


def _all_to_all_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    return torch.ops.torchcomms.all_to_all_single(grad, ctx.comm_name), None


all_reduce.register_autograd(_all_reduce_backward, setup_context=_setup_name)
all_gather_single.register_autograd(_all_gather_backward, setup_context=_setup_name)
reduce_scatter_single.register_autograd(_reduce_scatter_backward, setup_context=_setup_name)
all_to_all_single.register_autograd(_all_to_all_backward, setup_context=_setup_name)
