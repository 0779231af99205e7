"""Tensors as MPI buffers (zero-copy) and our reduce ops as MPI ops.

A contiguous CPU tensor is handed to MPI as ``[buffer at data_ptr, datatype]``: no copy,
no pickling. MPI has no bfloat16 (and Open MPI's float16 reductions are not portable), so both
half types travel as 16-bit integers and are reduced by user-defined MPI ops written with
torch: each partial sum is rounded to the half type, as gloo and NCCL do, and the bytes on the
wire stay half-sized (no upcast). bool reduces with MPI's logical ops (SUM/MAX = or,
PRODUCT/MIN = and). AVG and PREMUL_SUM are composed by the backend (SUM, then divide; scale,
then SUM).
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from torchcomms.errors import CommValueError
from torchcomms.types import RedOpType

#: dtypes this backend moves; the value is the name of MPI's datatype for it
_DATATYPES: dict[torch.dtype, str] = {
    torch.bool: "C_BOOL",
    torch.uint8: "UINT8_T",
    torch.int8: "INT8_T",
    torch.int16: "INT16_T",
    torch.int32: "INT32_T",
    torch.int64: "INT64_T",
    torch.float16: "INT16_T",  # raw 16-bit words; reduced by _HalfOps
    torch.bfloat16: "INT16_T",
    torch.float32: "FLOAT",
    torch.float64: "DOUBLE",
    torch.complex64: "C_FLOAT_COMPLEX",
    torch.complex128: "C_DOUBLE_COMPLEX",
}
MPI_DTYPES = frozenset(_DATATYPES)
#: the same dtypes in one fixed order (a point-to-point tag carries the index, see .p2p)
DTYPE_ORDER = tuple(_DATATYPES)
HALF_DTYPES = (torch.float16, torch.bfloat16)

_MPI_OPS = {
    RedOpType.SUM: "SUM", RedOpType.AVG: "SUM", RedOpType.PREMUL_SUM: "SUM", RedOpType.PRODUCT: "PROD",
    RedOpType.MIN: "MIN", RedOpType.MAX: "MAX", RedOpType.BAND: "BAND", RedOpType.BOR: "BOR",
    RedOpType.BXOR: "BXOR",
}
_BOOL_OPS = {
    RedOpType.SUM: "LOR", RedOpType.MAX: "LOR", RedOpType.PRODUCT: "LAND", RedOpType.MIN: "LAND",
}


class Buffers:
    """Per-process translation tables (the MPI datatypes and the user-defined half ops)."""

    def __init__(self, MPI: Any) -> None:  # noqa: N803
        self.MPI = MPI
        self._types = {dt: getattr(MPI, name) for dt, name in _DATATYPES.items()}
        self._half_ops: dict[tuple[torch.dtype, RedOpType], Any] = {}
        self._lock = threading.Lock()

    def datatype(self, dtype: torch.dtype) -> Any:
        return self._types[dtype]

    def spec(self, t: torch.Tensor) -> list[Any]:
        """``[buffer, datatype]`` over ``t``'s memory (``t`` contiguous, on the CPU); for the
        collectives that split a buffer into one block per rank, mpi4py divides it evenly."""
        return [self.MPI.buffer.fromaddress(t.data_ptr(), t.numel() * t.element_size()), self._types[t.dtype]]

    def vspec(self, t: torch.Tensor, counts: list[int]) -> list[Any]:
        """``[buffer, (counts, displacements), datatype]`` for the v-collectives (counts in elements)."""
        displs = [0] * len(counts)
        for i in range(1, len(counts)):
            displs[i] = displs[i - 1] + counts[i - 1]
        return [self.MPI.buffer.fromaddress(t.data_ptr(), t.numel() * t.element_size()), (counts, displs),
                self._types[t.dtype]]

    def op(self, red: RedOpType, dtype: torch.dtype) -> Any:
        """The MPI op that reduces ``dtype`` as ``red`` does (AVG/PREMUL_SUM: their SUM)."""
        if dtype in HALF_DTYPES:
            return self._half_op(red, dtype)
        if dtype is torch.bool:
            name = _BOOL_OPS.get(red)
            if name is None:
                raise TypeError(f"{red.name} is not defined for bool tensors")
            return getattr(self.MPI, name)
        return getattr(self.MPI, _MPI_OPS[red])

    def _half_op(self, red: RedOpType, dtype: torch.dtype) -> Any:
        base = RedOpType.SUM if red in (RedOpType.AVG, RedOpType.PREMUL_SUM) else red
        key = (dtype, base)
        with self._lock:
            op = self._half_ops.get(key)
            if op is None:
                op = self._half_ops[key] = self.MPI.Op.Create(_half_reducer(base, dtype), commute=True)
        return op


def _half_reducer(red: RedOpType, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    """An MPI user function ``f(inbuf, inoutbuf, datatype)``: ``inoutbuf = inbuf (red) inoutbuf``
    over half-precision values, computed by torch in that precision."""
    combine = {
        RedOpType.SUM: torch.add, RedOpType.PRODUCT: torch.mul, RedOpType.MIN: torch.minimum,
        RedOpType.MAX: torch.maximum,
    }.get(red)
    if combine is None:
        raise TypeError(f"{red.name} is not defined for {dtype}")

    def reduce(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        if len(inoutbuf) == 0:  # MPI may reduce empty pieces (torch.frombuffer refuses them)
            return
        src = torch.frombuffer(inbuf, dtype=dtype)
        dst = torch.frombuffer(inoutbuf, dtype=dtype)
        combine(src, dst, out=dst)

    return reduce


#: the largest count or displacement one MPI call takes (MPI's counts are C ints; Open MPI 5 has
#: no large-count calls)
MPI_INT_MAX = 2**31 - 1


def _tensors(keep: Any) -> list[torch.Tensor]:
    if isinstance(keep, torch.Tensor):
        return [keep]
    if isinstance(keep, (tuple, list)):
        return [t for item in keep for t in _tensors(item)]
    return []


def too_many_elements(keep: Any, comm: str) -> CommValueError | None:
    """The error of an MPI call that failed on the buffers ``keep`` (a tensor, or tuples and
    lists holding them) because one holds more elements than an MPI count or displacement can
    express, else ``None``. Asked only once a call failed: a buffer past the limit is fine where
    MPI counts it per rank (an all-gather's output)."""
    big = max((t.numel() for t in _tensors(keep)), default=0)
    if big <= MPI_INT_MAX:
        return None
    return CommValueError(
        f"a buffer of this op holds {big} elements, and MPI takes at most {MPI_INT_MAX} elements per count or "
        "displacement (a C int) in one call: split the op into smaller ones", comm=comm)
