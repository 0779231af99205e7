"""Plain value types of the public API: reduce ops, op names, timeouts, options, p2p ops."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import torch


class RedOpType(enum.Enum):
    """The kind of a :class:`ReduceOp` (``ReduceOp.SUM.type is RedOpType.SUM``)."""

    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"
    PREMUL_SUM = "premul_sum"
    AVG = "avg"


class ReduceOp:
    """A reduction: ``ReduceOp.SUM`` … ``ReduceOp.AVG``, or ``ReduceOp.PREMUL_SUM(factor)``.

    ``PREMUL_SUM`` multiplies every input by ``factor`` (a Python scalar or a one-element
    tensor) before summing.
    """

    __slots__ = ("_type", "_factor", "_label")

    SUM: ReduceOp
    PRODUCT: ReduceOp
    MIN: ReduceOp
    MAX: ReduceOp
    BAND: ReduceOp
    BOR: ReduceOp
    BXOR: ReduceOp
    AVG: ReduceOp

    def __init__(self, op_type: RedOpType, factor: Union[float, int, "torch.Tensor", None] = None):
        if not isinstance(op_type, RedOpType):
            raise TypeError(f"ReduceOp needs a RedOpType, got {type(op_type).__name__}")
        if op_type is RedOpType.PREMUL_SUM and factor is None:
            raise ValueError("ReduceOp.PREMUL_SUM needs a factor: ReduceOp.PREMUL_SUM(0.5)")
        self._type = op_type
        self._factor = factor

    @staticmethod
    def PREMUL_SUM(factor: Union[float, int, "torch.Tensor"]) -> ReduceOp:  # noqa: N802
        """A sum of inputs each multiplied by ``factor`` first."""
        import torch

        if isinstance(factor, torch.Tensor):
            if factor.numel() != 1:
                raise ValueError(
                    f"ReduceOp.PREMUL_SUM factor tensor must have one element, got shape {tuple(factor.shape)}"
                )
        elif isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise TypeError(f"ReduceOp.PREMUL_SUM factor must be a number or a tensor, got {type(factor).__name__}")
        return ReduceOp(RedOpType.PREMUL_SUM, factor)

    @property
    def type(self) -> RedOpType:
        return self._type

    @property
    def factor(self) -> Union[float, int, "torch.Tensor", None]:
        return self._factor

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RedOpType):
            return self._type is other
        if not isinstance(other, ReduceOp):
            return NotImplemented
        return self._type is other._type and self._factor is other._factor

    def __hash__(self) -> int:
        return hash((self._type, id(self._factor)))

    def __copy__(self) -> ReduceOp:
        return ReduceOp(self._type, self._factor)

    def __deepcopy__(self, memo: dict[int, Any]) -> ReduceOp:
        import copy

        return ReduceOp(self._type, copy.deepcopy(self._factor, memo))

    @property
    def label(self) -> str:
        """``repr`` without the ``ReduceOp.`` prefix, cached (op records carry it per op)."""
        try:
            return self._label
        except AttributeError:
            self._label: str = repr(self)[9:]
            return self._label

    def __repr__(self) -> str:
        if self._type is RedOpType.PREMUL_SUM:
            return f"ReduceOp.PREMUL_SUM({self._factor!r})"
        return f"ReduceOp.{self._type.name}"


for _t in RedOpType:
    if _t is not RedOpType.PREMUL_SUM:
        setattr(ReduceOp, _t.name, ReduceOp(_t))


class OpName(str, enum.Enum):
    """Names of the operations that go through the dispatch path."""

    send = "send"
    recv = "recv"
    broadcast = "broadcast"
    all_reduce = "all_reduce"
    reduce = "reduce"
    all_gather = "all_gather"
    all_gather_v = "all_gather_v"
    all_gather_single = "all_gather_single"
    reduce_scatter = "reduce_scatter"
    reduce_scatter_v = "reduce_scatter_v"
    reduce_scatter_single = "reduce_scatter_single"
    all_to_all_single = "all_to_all_single"
    all_to_all_v_single = "all_to_all_v_single"
    all_to_all = "all_to_all"
    barrier = "barrier"
    scatter = "scatter"
    gather = "gather"
    gather_single = "gather_single"
    split = "split"
    new_window = "new_window"
    finalize = "finalize"
    batch_p2p = "batch_p2p"
    shrink = "shrink"
    reconfigure = "reconfigure"

    def __str__(self) -> str:
        return self.value


class Timeout(timedelta):
    """A timeout; a ``timedelta`` so it goes wherever c10d takes one."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Timeout:
        if len(args) == 1 and not kwargs and isinstance(args[0], timedelta):
            td = args[0]
            return super().__new__(cls, days=td.days, seconds=td.seconds, microseconds=td.microseconds)
        return super().__new__(cls, *args, **kwargs)


class WorkStatus(enum.Enum):
    """Where a :class:`TorchWork` stands."""

    NOT_STARTED = "not_started"
    INPROGRESS = "inprogress"
    COMPLETED = "completed"
    TIMEDOUT = "timedout"
    ERROR = "error"


@dataclass
class CommOptions:
    """What a communicator was created with (``TorchComm.get_options()``)."""

    abort_process_on_timeout_or_error: bool = False
    timeout: timedelta = field(default_factory=lambda: timedelta(seconds=600))
    high_priority_stream: bool = False
    store: Any = None
    hints: dict[str, str] = field(default_factory=dict)
    enable_reconfigure: bool = False


class P2POpType(enum.Enum):
    """Whether a :class:`P2POp` of a batch sends or receives."""

    SEND = "send"
    RECV = "recv"


@dataclass
class P2POp:
    """One point-to-point operation of a batch."""

    type: P2POpType
    tensor: "torch.Tensor"
    peer: int


@dataclass
class BatchP2POptions:
    """Options for :meth:`BatchSendRecv.issue`."""

    hints: dict[str, str] | None = None
    timeout: timedelta | None = None


__all__ = [
    "BatchP2POptions",
    "CommOptions",
    "OpName",
    "P2POp",
    "P2POpType",
    "RedOpType",
    "ReduceOp",
    "Timeout",
    "WorkStatus",
]
