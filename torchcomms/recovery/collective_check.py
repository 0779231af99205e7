"""Collective signature check: a debug mode that catches mismatched collectives before the
engine sees them.

Before each collective, every rank all-gathers a fixed-size signature of the call it is about
to make (sequence number, op, root, reduce op, dtypes, shapes) on a side engine of the same
backend, and compares. Ranks that called different collectives, or the same one with tensors
that cannot fit together, all raise the same ``CollectiveMismatchError`` naming who called
what, instead of hanging or (gloo, on a size mismatch) aborting the process in C++.

Switched on by ``TORCHCOMM_CHECK_COLLECTIVES=1`` or the hint ``torchcomms.check_collectives=1``
on every rank alike (``torchcomms.backends.check_mode``); it costs one small all_gather per
collective, so it is a debugging aid, like c10d's ``TORCH_DISTRIBUTED_DEBUG=DETAIL``.
"""
from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from torchcomms.backends.base import TorchCommBackend
from torchcomms.core.errors import format_ranks
from torchcomms.core.store_calls import EngineNotReady
from torchcomms.core.op import OpRecord
from torchcomms.core.types import OpName, RedOpType

SLOTS = 24
_VERSION = 1
_MAX_DIMS = 4

# Which parts of a call must agree across ranks, per op: (inputs' dtype, outputs' dtype, inputs'
# shapes, outputs' shapes). Rooted ops whose lists exist on the root only compare the side every
# rank has. The *_v ops take per-rank sizes, but every rank lists them all alike: all_gather_v's
# output list and reduce_scatter_v's input list (validation made this rank's entry fit its own
# tensor). all_to_all_v_single's sizes differ per rank by design: besides its dtypes, what each
# rank sends each other rank must be what that rank expects from it (compared as two sums of codes
# of (sender, receiver, elements), one over what is sent, one over what is expected).
_RULES: dict[str, tuple[bool, bool, bool, bool]] = {
    "broadcast": (True, True, True, True),
    "all_reduce": (True, True, True, True),
    "reduce": (True, True, True, True),
    "all_gather": (True, True, True, True),
    "all_gather_single": (True, True, True, True),
    "reduce_scatter": (True, True, True, True),
    "reduce_scatter_single": (True, True, True, True),
    "all_to_all_single": (True, True, True, True),
    "all_to_all": (True, True, True, True),
    "barrier": (True, True, True, True),
    "split": (True, True, True, True),
    "all_gather_v": (True, True, False, True),
    "reduce_scatter_v": (True, True, True, False),
    "all_to_all_v_single": (True, True, False, False),
    "scatter": (False, True, False, True),
    "gather": (True, False, True, False),
    "gather_single": (True, False, True, False),
}
_ROOTED = {"broadcast", "reduce", "scatter", "gather", "gather_single"}
_OP_CODES = {str(op): i for i, op in enumerate(OpName)}
_OP_NAMES = {i: name for name, i in _OP_CODES.items()}


def _code(text: str) -> int:
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


# Names of what other ranks send as codes: every dtype and reduce op is known up front.
_DTYPE_BY_CODE: dict[int, str] = {
    _code(str(v)[6:]): str(v)[6:] for v in vars(torch).values() if isinstance(v, torch.dtype)
}
_REDOP_BY_CODE: dict[int, str] = {_code(t.name): t.name for t in RedOpType}


def _shape_slots(sizes: Sequence[Sequence[int]]) -> list[int]:
    first = list(sizes[0]) if sizes else []
    dims = first[:_MAX_DIMS] + [-1] * (_MAX_DIMS - min(len(first), _MAX_DIMS))
    return [len(first) if sizes else -1, *dims]


def _pair_codes(rank: int, send: Sequence[int], receive: Sequence[int]) -> tuple[int, int]:
    """The sums of the codes of (sender, receiver, elements) over what ``rank`` sends and over
    what it expects: summed over all ranks, the two are equal when every pair agrees."""
    sent = sum(_code(f"{rank}>{peer}:{n}") for peer, n in enumerate(send))
    expected = sum(_code(f"{peer}>{rank}:{n}") for peer, n in enumerate(receive))
    return sent, expected


def encode(rec: OpRecord, counts: tuple[Sequence[int], Sequence[int]] | None = None) -> torch.Tensor:
    """The fixed-size signature of the call ``rec`` describes; ``counts``: the elements it sends
    to and expects from each rank (all_to_all_v_single)."""
    # one dtype per side: validation already made every tensor of a list share it
    in_dtype = rec.input_dtypes[0] if rec.input_dtypes else None
    out_dtype = rec.output_dtypes[0] if rec.output_dtypes else None
    slots = [
        _VERSION,
        int(rec.seq),
        _OP_CODES.get(str(rec.name), -1),
        rec.root if rec.root is not None else -1,
        # the reduce op's kind only: a PREMUL_SUM factor may differ per rank
        _code(rec.reduce_op.split("(")[0]) if rec.reduce_op else -1,
        _code(in_dtype) if in_dtype else -1,
        _code(out_dtype) if out_dtype else -1,
        len(rec.input_sizes or []),
        len(rec.output_sizes or []),
        *_shape_slots(rec.input_sizes or []),
        *_shape_slots(rec.output_sizes or []),
        _code(repr(rec.input_sizes or [])),
        _code(repr(rec.output_sizes or [])),
        *(_pair_codes(int(rec.rank), *counts) if counts is not None else (0, 0)),
    ]
    slots += [0] * (SLOTS - len(slots))
    return torch.tensor(slots, dtype=torch.int64)


@dataclass(frozen=True)
class _Call:
    """One rank's decoded signature."""

    seq: int
    op: str
    root: int
    redop: int
    in_dtype: int
    out_dtype: int
    n_in: int
    n_out: int
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    in_crc: int
    out_crc: int
    sent: int
    expected: int

    @classmethod
    def decode(cls, row: Sequence[int]) -> _Call:
        def shape(at: int) -> tuple[int, ...]:
            ndim = row[at]
            return tuple(row[at + 1: at + 1 + min(max(ndim, 0), _MAX_DIMS)]) + (("…",) if ndim > _MAX_DIMS else ())  # type: ignore[return-value]

        return cls(seq=row[1], op=_OP_NAMES.get(row[2], f"op{row[2]}"), root=row[3], redop=row[4],
                   in_dtype=row[5], out_dtype=row[6], n_in=row[7], n_out=row[8], in_shape=shape(9),
                   out_shape=shape(14), in_crc=row[19], out_crc=row[20], sent=row[21], expected=row[22])

    def key(self, op: str) -> tuple[object, ...]:
        """What must be equal across ranks for ``op``."""
        in_dtype, out_dtype, in_shapes, out_shapes = _RULES.get(op, (False, False, False, False))
        return (
            self.seq, self.op,
            self.root if op in _ROOTED else None,
            self.redop,
            self.in_dtype if in_dtype else None,
            self.out_dtype if out_dtype else None,
            (self.n_in, self.in_crc) if in_shapes else None,
            (self.n_out, self.out_crc) if out_shapes else None,
        )

    def describe(self) -> str:
        def tensors(dtype: int, shape: tuple[int, ...], n: int) -> str:
            if n <= 0:
                return "-"
            name = _DTYPE_BY_CODE.get(dtype, "?")
            more = f" +{n - 1} more" if n > 1 else ""
            return f"{name}[{', '.join(map(str, shape))}]{more}"

        parts = [f"in {tensors(self.in_dtype, self.in_shape, self.n_in)}",
                 f"out {tensors(self.out_dtype, self.out_shape, self.n_out)}"]
        if self.op in _ROOTED:
            parts.append(f"root {self.root}")
        if self.redop >= 0:
            parts.append(_REDOP_BY_CODE.get(self.redop, "reduce op ?"))
        return f"{self.op} #{self.seq} ({'; '.join(parts)})"


def compare(gathered: torch.Tensor, op: str) -> tuple[str, list[int]] | None:
    """``None`` when the ranks' signatures (rows of ``gathered``) fit together, else a message
    saying who called what and the ranks that differ from the most common call."""
    calls = [_Call.decode(row) for row in gathered.tolist()]
    groups: dict[tuple[object, ...], list[int]] = {}
    for rank, call in enumerate(calls):
        groups.setdefault(call.key(op), []).append(rank)
    if len(groups) == 1:
        if sum(c.sent for c in calls) == sum(c.expected for c in calls):
            return None
        return (f"collective mismatch: {calls[0].describe()}: the split sizes do not pair up (rank i's "
                "input_split_sizes[j] must be rank j's output_split_sizes[i], in elements)", [])
    ordered = sorted(groups.values(), key=lambda ranks: (-len(ranks), ranks[0]))
    lines = [f"rank{'s' if len(r) > 1 else ''} {format_ranks(r)}: {calls[r[0]].describe()}" for r in ordered]
    odd = sorted(r for group in ordered[1:] for r in group)
    return "collective mismatch: " + " | ".join(lines), odd


class SignatureCheck:
    """One communicator's check: a side engine (made on first use, collectively) that
    all-gathers the signatures. ``make_engine(deadline)`` builds it, or returns ``None`` when it
    was not ready by ``deadline``."""

    def __init__(self, make_engine: Callable[[float], TorchCommBackend | None], size: int) -> None:
        self._make_engine = make_engine
        self._size = size
        self._engine: TorchCommBackend | None = None
        self._counts: dict[int, tuple[list[int], list[int]]] = {}
        #: held by dispatch from a collective's sequence number to its engine call (re-entrant: a
        #: pre-hook may run a collective on the same communicator)
        self.order = threading.RLock()

    def note_counts(self, op_id: int, send: list[int], receive: list[int]) -> None:
        """The elements op ``op_id`` sends to and expects from each rank, for its signature."""
        self._counts[op_id] = (send, receive)

    def run(self, rec: OpRecord, deadline: float) -> tuple[str, list[int]] | None:
        """Exchange and compare ``rec``'s signature with every rank's, by ``deadline``
        (``time.monotonic()``). Returns ``None`` or ``(message, ranks that differ)``. Raises
        ``TimeoutError`` when not every rank arrived in time (:class:`EngineNotReady` when the
        side engine was not built in time), the engine's error otherwise."""
        counts = self._counts.pop(rec.op_id, None)
        if self._engine is None:
            self._engine = self._make_engine(deadline)
            if self._engine is None:
                raise EngineNotReady("the collective check's engine was not ready before the deadline")
        out = torch.empty(self._size * SLOTS, dtype=torch.int64)
        error = self._engine.all_gather_single(out, encode(rec, counts)).wait_until(deadline)
        if error is not None:
            raise error
        return compare(out.view(self._size, SLOTS), str(rec.name))

    def revoke(self) -> None:
        """Make the peers' ops on the side engine fail now (see ``TorchCommBackend.revoke``)."""
        if self._engine is not None:
            self._engine.revoke()

    def close(self, abort: bool) -> None:
        """Release (or, after a failure, abandon) the side engine."""
        engine, self._engine = self._engine, None
        if engine is None:
            return
        try:
            engine.abort() if abort else engine.finalize()
        except Exception:  # noqa: BLE001 - closing never raises
            pass
