"""The record of one operation on the dispatch path, shared by hooks, tracing and recovery."""
from __future__ import annotations

from typing import Any


class OpRecord:
    """What an operation was, where it stands, and how it ended.

    Built once per op by ``TorchComm`` before dispatch; updated in place as the op starts and
    completes. ``state`` is the outcome the caller sees (``scheduled``, ``started``, then
    ``completed``, ``failed``, ``timed_out`` or ``aborted``); ``in_engine`` is true from the
    engine call until the engine is done with the op. The two differ when the caller was
    failed (deadline, peer failure, abort) while the engine still blocks in the op: then the
    op ended for the caller but not in the engine, and tracing says so. Hooks receive it
    (``pre_hook(name, op_id, record)``, ``post_hook(op_id, record)``), so it carries the fields of
    the reference's pre-hook arguments (``tensor``, ``root``, ``peer``, ``async_op``); tracing
    keeps references to it, so fields are only ever filled in, never reused.
    """

    __slots__ = (
        "comm_name",
        "comm_ranks",
        "rank",
        "size",
        "backend",
        "name",
        "seq",
        "op_id",
        "is_p2p",
        "peer",
        "root",
        "reduce_op",
        "input_sizes",
        "input_dtypes",
        "output_sizes",
        "output_dtypes",
        "timeout_s",
        "async_op",
        "time_created_ns",
        "time_started_ns",
        "time_completed_ns",
        "device_duration_ms",
        "state",
        "in_engine",
        "error",
        "hints",
        "extra",
    )

    def __init__(
        self,
        comm_name: str,
        comm_ranks: tuple[int, ...],
        rank: int,
        size: int,
        backend: str,
        name: Any,
        seq: int,
        op_id: int,
        timeout_s: float,
        async_op: bool,
        time_created_ns: int,
        *,
        is_p2p: bool = False,
        peer: int | None = None,
        root: int | None = None,
        reduce_op: str | None = None,
        input_sizes: list[list[int]] | None = None,
        input_dtypes: list[str] | None = None,
        output_sizes: list[list[int]] | None = None,
        output_dtypes: list[str] | None = None,
        hints: dict[str, str] | None = None,
    ) -> None:
        self.comm_name = comm_name
        self.comm_ranks = comm_ranks
        self.rank = rank
        self.size = size
        self.backend = backend
        self.name = name
        self.seq = seq
        self.op_id = op_id
        self.is_p2p = is_p2p
        self.peer = peer
        self.root = root
        self.reduce_op = reduce_op
        self.input_sizes: list[list[int]] = [] if input_sizes is None else input_sizes
        self.input_dtypes: list[str] = [] if input_dtypes is None else input_dtypes
        self.output_sizes: list[list[int]] = [] if output_sizes is None else output_sizes
        self.output_dtypes: list[str] = [] if output_dtypes is None else output_dtypes
        self.timeout_s = timeout_s
        self.async_op = async_op
        self.time_created_ns = time_created_ns
        self.time_started_ns: int | None = None
        self.time_completed_ns: int | None = None
        # the op's time on the device between its start and end events (stream-ordered engines
        # with timing on), filled when the op is seen completed; None otherwise
        self.device_duration_ms: float | None = None
        self.state = "scheduled"
        self.in_engine = False
        self.error: str | None = None
        self.hints = hints
        self.extra: dict[str, Any] | None = None

    @property
    def tensor(self) -> Any:
        """The tensor the op works on, as the reference's pre-hook arguments name it (the first
        of its inputs, else of its outputs: a receive's buffer). Set only while pre-hooks run;
        ``None`` otherwise (records outlive ops and never pin their tensors)."""
        if self.extra is None:
            return None
        return (self.extra.get("inputs") or self.extra.get("outputs") or [None])[0]

    @property
    def duration_ms(self) -> float | None:
        """Start-to-completion time, once completed."""
        if self.time_completed_ns is None or self.time_started_ns is None:
            return None
        return (self.time_completed_ns - self.time_started_ns) / 1e6

    def as_dict(self) -> dict[str, Any]:
        """A plain-dict view (JSON-friendly)."""
        d = {k: getattr(self, k) for k in self.__slots__}
        d["name"] = str(self.name)
        d["comm_ranks"] = list(self.comm_ranks)
        return d

    def __repr__(self) -> str:
        return (
            f"OpRecord({self.comm_name!r} {self.name} #{self.seq} rank {self.rank}/{self.size} "
            f"state={self.state})"
        )


class SenderSlot:
    """Where a receive from any source names its sender: the dispatch path binds the op's
    record to it, and the engine calls :meth:`found` once the sender is known (the record's
    ``peer``, which ``TorchWork.source_rank()`` reads)."""

    __slots__ = ("record",)

    def __init__(self) -> None:
        self.record: OpRecord | None = None

    def bind(self, record: OpRecord) -> None:
        self.record = record

    def found(self, rank: int) -> None:
        if self.record is not None:
            self.record.peer = rank
