"""Local argument checks, run before an op gets a sequence number or reaches a backend.

Each check raises ``CommTypeError`` (also a ``TypeError``) or ``CommValueError`` (also a
``ValueError``) with a message naming the communicator, the op and the argument at fault.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from numbers import Integral
from typing import Any

import torch

from torchcomms.core.errors import CommTypeError, CommValueError
from torchcomms.core.types import RedOpType, ReduceOp

_Tensor = torch.Tensor
_BITWISE = (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)


class Checker:
    """Argument checks bound to one communicator's identity, rank, size and device."""

    __slots__ = ("comm", "rank", "size", "device_type", "device", "dtypes", "bitwise_ops", "backend",
                 "recv_any_source", "complex_product")

    def __init__(
        self,
        comm: str,
        rank: int,
        size: int,
        device: torch.device,
        dtypes: frozenset[torch.dtype] | None,
        bitwise_ops: bool = True,
        backend: str = "",
        recv_any_source: bool = False,
        complex_product: bool = True,
    ) -> None:
        self.comm = comm
        self.rank = rank
        self.size = size
        self.device = device
        self.device_type = device.type
        self.dtypes = dtypes
        self.bitwise_ops = bitwise_ops
        self.backend = backend
        self.recv_any_source = recv_any_source
        self.complex_product = complex_product

    # --- errors ----------------------------------------------------------------------------
    def type_error(self, op: str, msg: str) -> CommTypeError:
        return CommTypeError(msg, comm=self.comm, op=op)

    def value_error(self, op: str, msg: str) -> CommValueError:
        return CommValueError(msg, comm=self.comm, op=op)

    # --- scalars ---------------------------------------------------------------------------
    def flag(self, op: str, name: str, value: Any) -> None:
        if value is not True and value is not False:
            raise self.type_error(op, f"{name} must be a bool, got {type(value).__name__}")

    def rank_arg(self, op: str, name: str, value: Any, allow_self: bool = True) -> None:
        # any integer (numpy's too, as pybind's int conversion takes them in the reference), not a bool
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise self.type_error(op, f"{name} must be an int rank, got {type(value).__name__}")
        if not 0 <= value < self.size:
            raise self.value_error(op, f"{name}={value} is out of range for a communicator of size {self.size}")
        if not allow_self and value == self.rank:
            raise self.value_error(op, f"{name}={value} is this rank itself; a rank cannot {op} to itself")

    def any_source(self, op: str) -> None:
        """A receive from any source: only on engines that can take one."""
        if not self.recv_any_source:
            raise self.value_error(op, f"backend {self.backend!r} cannot receive from any source; name the "
                                       f"sending rank (recv(tensor, src, ...))")

    def timeout(self, op: str, value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, timedelta):
            secs = value.total_seconds()
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            secs = float(value)
        else:
            raise self.type_error(op, f"timeout must be a timedelta or seconds, got {type(value).__name__}")
        if not secs > 0:
            raise self.value_error(op, f"timeout must be positive, got {secs} s")
        return secs

    def hints(self, op: str, value: Any) -> None:
        if value is None:
            return
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise self.type_error(op, f"hints must be a dict[str, str], got {value!r}")

    def reduce_op(self, op: str, red: Any, dtype: torch.dtype) -> None:
        if not isinstance(red, ReduceOp):
            raise self.type_error(op, f"op must be a torchcomms.ReduceOp, got {red!r}")
        t = red.type
        if t is RedOpType.SUM:  # the common op, which every dtype takes: none of the checks below
            return
        if t in _BITWISE:
            if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
                raise self.type_error(op, f"{red!r} needs an integer tensor, got {dtype}")
            if not self.bitwise_ops:
                raise self.type_error(op, f"{red!r} is not supported by this backend")
        elif t is RedOpType.AVG and dtype == torch.bool:
            raise self.type_error(op, f"ReduceOp.AVG needs a numeric tensor, got {dtype}")
        elif t is RedOpType.PREMUL_SUM and not (dtype.is_floating_point or dtype.is_complex):
            raise self.type_error(op, f"ReduceOp.PREMUL_SUM needs a floating-point tensor, got {dtype}")
        elif t is RedOpType.PREMUL_SUM and isinstance(red.factor, _Tensor):
            self.premul_factor(op, red.factor, dtype)
        elif (t is RedOpType.MIN or t is RedOpType.MAX) and dtype.is_complex:
            # no engine orders complex numbers: gloo and MPI fail it in the engine, breaking the communicator
            raise self.type_error(op, f"{red!r} needs a real tensor (complex numbers have no order), got {dtype}")
        elif t is RedOpType.PRODUCT and dtype.is_complex and not self.complex_product:
            # gloo fails it inside the engine ("does not support PRODUCT on complex tensors"), breaking the communicator
            raise self.type_error(op, f"{red!r} of a complex tensor is not supported by backend {self.backend!r}, "
                                      f"got {dtype}")

    def premul_factor(self, op: str, factor: _Tensor, dtype: torch.dtype) -> None:
        """A PREMUL_SUM's tensor factor: real for a real tensor, and on the CPU or this
        communicator's device (a factor on another device scaled by an unspecified value, or failed
        in the engine; a complex one failed in the engine: both broke the communicator)."""
        if factor.dtype.is_complex and not dtype.is_complex:
            raise self.type_error(op, f"ReduceOp.PREMUL_SUM's factor is complex ({factor.dtype}) but the tensor is "
                                      f"{dtype}")
        if factor.device.type not in ("cpu", self.device_type):
            raise self.value_error(op, f"ReduceOp.PREMUL_SUM's factor is on {factor.device}, but this "
                                       f"communicator's device is {self.device} (or pass a CPU tensor or a number)")

    # --- tensors ---------------------------------------------------------------------------
    def tensor(self, op: str, name: str, t: Any) -> None:
        if not isinstance(t, _Tensor):
            raise self.type_error(op, f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout is not torch.strided:
            raise self.type_error(op, f"{name} must be a dense (strided) tensor, got layout {t.layout}")
        dev = t.device
        if dev.type != self.device_type or (self.device.index is not None and dev.index != self.device.index):
            raise self.value_error(op, f"{name} is on {dev}, but this communicator's device is {self.device}")
        if not t.is_contiguous():
            raise self.value_error(op, f"{name} must be contiguous (call .contiguous()); got strides {t.stride()}")
        if t.dtype.is_complex and t.is_conj():
            # its memory holds the unconjugated values, which an engine would send (or receive into)
            raise self.value_error(op, f"{name} is a conjugate view (x.conj()); call .resolve_conj() first")
        if self.dtypes is not None and t.dtype not in self.dtypes:
            raise self.type_error(op, f"{name} has dtype {t.dtype}, which this backend does not support")

    def tensor_list(self, op: str, name: str, ts: Any, length: int | None) -> None:
        if not isinstance(ts, (list, tuple)):
            raise self.type_error(op, f"{name} must be a list of tensors, got {type(ts).__name__}")
        if length is not None and len(ts) != length:
            raise self.value_error(op, f"{name} must have {length} tensors (one per rank), got {len(ts)}")
        for i, t in enumerate(ts):
            self.tensor(op, f"{name}[{i}]", t)

    def list_like(self, op: str, name: str, ts: Any, ref_name: str, ref: _Tensor) -> None:
        """One tensor per rank, each with ``ref``'s dtype and shape."""
        self.tensor_list(op, name, ts, self.size)
        for i, t in enumerate(ts):
            self.same_dtype(op, f"{name}[{i}]", t, ref_name, ref)
            self.same_shape(op, f"{name}[{i}]", t, ref_name, ref)

    def same_dtype(self, op: str, a_name: str, a: _Tensor, b_name: str, b: _Tensor) -> None:
        if a.dtype != b.dtype:
            raise self.type_error(op, f"{a_name} has dtype {a.dtype} but {b_name} has {b.dtype}")

    def same_shape(self, op: str, a_name: str, a: _Tensor, b_name: str, b: _Tensor) -> None:
        if a.shape != b.shape:
            raise self.value_error(op, f"{a_name} has shape {tuple(a.shape)} but {b_name} has {tuple(b.shape)}")

    def numel_ratio(self, op: str, big_name: str, big: _Tensor, small_name: str, small: _Tensor) -> None:
        if big.numel() != small.numel() * self.size:
            raise self.value_error(
                op,
                f"{big_name} must hold world_size ({self.size}) × {small_name}'s {small.numel()} elements "
                f"= {small.numel() * self.size}, got {big.numel()}",
            )

    def split_sizes(self, op: str, name: str, sizes: Any, t: _Tensor) -> list[int]:
        if not isinstance(sizes, (list, tuple)) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in sizes
        ):
            raise self.type_error(op, f"{name} must be a list of ints, got {sizes!r}")
        if len(sizes) != self.size:
            raise self.value_error(op, f"{name} must have {self.size} entries (one per rank), got {len(sizes)}")
        if any(s < 0 for s in sizes):
            raise self.value_error(op, f"{name} has a negative size: {list(sizes)}")
        dim0 = t.shape[0] if t.dim() > 0 else 1
        if sum(sizes) != dim0:
            raise self.value_error(op, f"{name} {list(sizes)} add up to {sum(sizes)}, but the tensor's dim 0 is {dim0}")
        return list(sizes)

    def split_ranks(self, ranks: Any) -> list[int]:
        op = "split"
        if not isinstance(ranks, (list, tuple)):
            raise self.type_error(op, f"ranks must be a list of ints, got {type(ranks).__name__}")
        out: list[int] = []
        for r in ranks:
            self.rank_arg(op, "ranks[]", r)
            out.append(int(r))
        if len(set(out)) != len(out):
            dups = sorted({r for r in out if out.count(r) > 1})
            raise self.value_error(op, f"ranks has duplicates: {dups}")
        if out and self.rank not in out:
            raise self.value_error(
                op, f"ranks {out} does not contain this rank ({self.rank}); non-members must pass []"
            )
        return out


    # --- whole ops whose arguments relate to each other ------------------------------------
    def pair(self, op: str, output: Any, input: Any) -> None:
        """``output`` and ``input`` tensors of one dtype."""
        self.tensor(op, "input", input)
        self.tensor(op, "output", output)
        self.same_dtype(op, "output", output, "input", input)

    def v_list(self, op: str, name: str, ts: Any, ref_name: str, ref: _Tensor) -> None:
        """A ``*_v`` op's per-rank list: ``ref``'s dtype, ``ref``'s shape at this rank."""
        self.tensor_list(op, name, ts, self.size)
        for i, t in enumerate(ts):
            self.same_dtype(op, f"{name}[{i}]", t, ref_name, ref)
        self.same_shape(op, f"{name}[{self.rank}]", ts[self.rank], ref_name, ref)

    def reduce_scatter(self, op: str, output: Any, inputs: Any, red: Any) -> list[_Tensor]:
        """A reduce-scatter's arguments: ``reduce_scatter`` (one ``output``-shaped input per rank),
        ``reduce_scatter_v`` (per-rank inputs, ``output``'s shape at this rank) or
        ``reduce_scatter_single`` (one input of world_size × ``output``); the reduce op against
        ``output``'s dtype. Returns the inputs as a list."""
        if op == "reduce_scatter_single":
            self.pair(op, output, inputs)
            self.numel_ratio(op, "input", inputs, "output", output)
            ins = [inputs]
        else:
            self.tensor(op, "output", output)
            (self.v_list if op == "reduce_scatter_v" else self.list_like)(op, "input_list", inputs, "output", output)
            ins = list(inputs)
        self.reduce_op(op, red, output.dtype)
        return ins

    def not_overlapping(self, op: str, output: _Tensor, input: _Tensor) -> None:
        """``output`` and ``input`` (contiguous) share no memory: an all-to-all writes rows of its
        output before it has sent every row of its input, so in place it sends overwritten rows."""
        if output.numel() == 0 or input.numel() == 0:
            return
        o, i = output.data_ptr(), input.data_ptr()
        if o < i + input.nbytes and i < o + output.nbytes:
            raise self.value_error(op, "output and input overlap in memory; an all-to-all cannot run in place "
                                       "(pass an output tensor of its own)")

    def all_to_all_single(self, output: Any, input: Any) -> None:
        op = "all_to_all_single"
        self.pair(op, output, input)
        self.not_overlapping(op, output, input)
        if output.numel() != input.numel():
            raise self.value_error(op, f"output has {output.numel()} elements but input has {input.numel()}")
        if input.numel() % self.size:
            raise self.value_error(op, f"input's {input.numel()} elements do not split evenly over {self.size} ranks")

    def all_to_all_v_single(self, output: Any, input: Any, out_sizes: Any, in_sizes: Any) -> tuple[list[int], list[int]]:
        op = "all_to_all_v_single"
        self.pair(op, output, input)
        self.not_overlapping(op, output, input)
        if input.dim() == 0 or output.dim() == 0:
            raise self.value_error(op, "input and output must have at least one dimension to split along")
        if input.shape[1:] != output.shape[1:]:
            raise self.value_error(op, f"input and output must agree beyond dim 0: {tuple(input.shape)} vs "
                                       f"{tuple(output.shape)}")
        return (self.split_sizes(op, "output_split_sizes", out_sizes, output),
                self.split_sizes(op, "input_split_sizes", in_sizes, input))

    def all_to_all(self, outputs: Any, inputs: Any) -> None:
        op = "all_to_all"
        self.tensor_list(op, "output_tensor_list", outputs, self.size)
        self.tensor_list(op, "input_tensor_list", inputs, self.size)
        dt = inputs[0].dtype if inputs else None
        for t in list(inputs) + list(outputs):
            if t.dtype != dt:
                raise self.type_error(op, f"all tensors must share one dtype; found {dt} and {t.dtype}")

    def rooted(self, op: str, root: Any, name: str, t: Any) -> bool:
        """A rooted op's ``root`` and this rank's tensor ``name``; True on the root."""
        self.tensor(op, name, t)
        self.rank_arg(op, "root", root)
        return self.rank == root


def shapes(ts: Sequence[_Tensor]) -> list[list[int]]:
    return [list(t.shape) for t in ts]


def dtypes(ts: Sequence[_Tensor]) -> list[str]:
    return [str(t.dtype).replace("torch.", "") for t in ts]
