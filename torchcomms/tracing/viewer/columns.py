"""One rank's ops in columns: a row per entry, the per-op numbers in numpy arrays, and what
many ops repeat (communicator, op, sizes, dtypes, call stack, peer, root, ...) once per dump in
a table of :class:`Kind` s that rows point into.

:class:`OpColumns` is a ``Sequence[Op]``: indexing or iterating builds :class:`~.load.Op`
objects equal to the ones the entry-by-entry parse gives, so code that reads ops keeps working,
while the analysis reads the arrays. :func:`columns_of_entries` fills the columns; an entry whose
repeated part was seen before costs a few dictionary look-ups, any other goes through the
entry-by-entry parse (``load._parse_entry``), so both agree, errors included.
"""
from __future__ import annotations

import marshal
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, NamedTuple, overload

import numpy as np

from torchcomms.tracing.fr_format import P2P_SEQ_BASE

__all__ = ["Kind", "OpColumns", "columns_of_entries", "columns_of_ops"]

_INF = float("inf")
#: ints at or past this magnitude are no dump's numbers (times and sequence numbers past
#: int64 are analysed exactly; one of thousands of digits could not even be printed)
_INT_BOUND = 1 << 512


class Kind(NamedTuple):
    """What ops of one dump share (everything of an :class:`~.load.Op` but its numbers and state)."""

    comm: str
    op: str
    backend: str
    is_p2p: bool
    input_sizes: list[list[int]]
    input_dtypes: list[str]
    output_sizes: list[list[int]]
    output_dtypes: list[str]
    timeout_ms: int | None
    frames: list[dict[str, Any]]
    error: str | None
    peer: int | None
    root: int | None
    reduce_op: str | None
    comm_rank: int | None
    outcome: str | None


def _kind_of(op: Any) -> Kind:
    return Kind(op.comm, op.op, op.backend, op.is_p2p, op.input_sizes, op.input_dtypes, op.output_sizes,
                op.output_dtypes, op.timeout_ms, op.frames, op.error, op.peer, op.root, op.reduce_op,
                op.comm_rank, op.outcome)


def _int_column(values: list[Any]) -> np.ndarray:
    """int64 where every value fits, else an object array of Python ints."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array(values, dtype=object)


def _optional_int_column(values: list[int | None]) -> tuple[np.ndarray, np.ndarray]:
    """(values with 0 for None, mask of the values present); an int of 512 bits or more is
    absent (see ``_INT_BOUND``)."""
    try:
        return np.array(values, dtype=np.int64), np.ones(len(values), dtype=bool)
    except (TypeError, OverflowError):  # a None (or an int past int64) among them
        obj = np.array([v if v is None or -_INT_BOUND < v < _INT_BOUND else None for v in values], dtype=object)
        present = np.not_equal(obj, None).astype(bool)
        return _int_column(np.where(present, obj, 0).tolist()), present


class OpColumns(Sequence[Any]):
    """A rank's ops as columns (see the module doc); reads as a sequence of ``Op``."""

    __slots__ = ("rank", "kinds", "states", "kind", "state", "seq", "record_id", "created", "has_created",
                 "started", "has_started", "completed", "has_completed", "duration", "has_duration",
                 "core_seq", "has_core_seq")

    def __init__(self, rank: int, kinds: list[Kind], states: list[str], kind: list[int], state: list[int],
                 seq: list[int], record_id: list[int], created: list[int | None], started: list[int | None],
                 completed: list[int | None], duration: list[float | None], core_seq: list[int | None]) -> None:
        self.rank = rank
        self.kinds = kinds
        self.states = states
        self.kind = np.array(kind, dtype=np.int32)
        self.state = np.array(state, dtype=np.int16)
        self.seq = _int_column(seq)
        self.record_id = _int_column(record_id)
        self.created, self.has_created = _optional_int_column(created)
        self.started, self.has_started = _optional_int_column(started)
        self.completed, self.has_completed = _optional_int_column(completed)
        self.core_seq, self.has_core_seq = _optional_int_column(core_seq)
        if None not in duration:  # (numpy would read a None as NaN)
            dur = np.array(duration, dtype=np.float64)
        else:
            dur = np.where(np.not_equal(np.array(duration, dtype=object), None), duration, np.nan).astype(np.float64)
        self.has_duration = np.isfinite(dur)  # NaN and infinities are no measurement (``float_or_none``)
        self.duration = np.where(self.has_duration, dur, 0.0)

    def __len__(self) -> int:
        return len(self.kind)

    def _op(self, i: int, cols: tuple[Any, ...]) -> Any:
        from torchcomms.tracing.viewer.load import Op

        (kind, state, seq, rid, created, has_created, started, has_started, completed, has_completed,
         duration, has_duration, core, has_core) = cols
        k = self.kinds[kind[i]]
        return Op(
            rank=self.rank, comm=k.comm, op=k.op, backend=k.backend, seq=int(seq[i]), is_p2p=k.is_p2p,
            record_id=int(rid[i]), input_sizes=k.input_sizes, input_dtypes=k.input_dtypes,
            output_sizes=k.output_sizes, output_dtypes=k.output_dtypes, state=self.states[state[i]],
            created_ns=int(created[i]) if has_created[i] else None,
            started_ns=int(started[i]) if has_started[i] else None,
            completed_ns=int(completed[i]) if has_completed[i] else None,
            duration_ms=float(duration[i]) if has_duration[i] else None,
            timeout_ms=k.timeout_ms, frames=k.frames, error=k.error, peer=k.peer, root=k.root,
            reduce_op=k.reduce_op, comm_rank=k.comm_rank, core_seq=int(core[i]) if has_core[i] else None,
            outcome=k.outcome,
        )

    def _cols(self, as_lists: bool) -> tuple[Any, ...]:
        cols = (self.kind, self.state, self.seq, self.record_id, self.created, self.has_created, self.started,
                self.has_started, self.completed, self.has_completed, self.duration, self.has_duration,
                self.core_seq, self.has_core_seq)
        return tuple(c.tolist() for c in cols) if as_lists else cols

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self._op(j, self._cols(False)) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("op index out of range")
        return self._op(i % n, self._cols(False))

    def __iter__(self) -> Iterator[Any]:
        cols = self._cols(True)
        for i in range(len(self)):
            yield self._op(i, cols)

    def ops_at(self, rows: Sequence[int]) -> list[Any]:
        """The ops of these rows."""
        cols = self._cols(False)
        return [self._op(int(i), cols) for i in rows]

    def comm_backends(self) -> dict[str, str]:
        """``{comm: backend of its first op}`` in the order the comms first appear."""
        out: dict[str, str] = {}
        for k in self.kinds:  # kinds are made in the order their first op appears
            out.setdefault(k.comm, k.backend)
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.rank, self.kinds, self.states, {s: getattr(self, s) for s in self.__slots__[3:]}))


def _rebuild(rank: int, kinds: list[Kind], states: list[str], arrays: dict[str, np.ndarray]) -> OpColumns:
    cols = OpColumns.__new__(OpColumns)
    cols.rank, cols.kinds, cols.states = rank, kinds, states
    for name, value in arrays.items():
        setattr(cols, name, value)
    return cols


class _Builder:
    """Rows appended one op at a time, then :meth:`done` makes the arrays."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.kinds: list[Kind] = []
        self.states: list[str] = []
        self.state_of: dict[str, int] = {}
        self.kind: list[int] = []
        self.state: list[int] = []
        self.seq: list[int] = []
        self.record_id: list[int] = []
        self.created: list[int | None] = []
        self.started: list[int | None] = []
        self.completed: list[int | None] = []
        self.duration: list[float | None] = []
        self.core_seq: list[int | None] = []

    def state_id(self, state: str) -> int:
        sid = self.state_of.get(state)
        if sid is None:
            sid = self.state_of[state] = len(self.states)
            self.states.append(state)
        return sid

    def add_op(self, op: Any, kind: int) -> None:
        self.kind.append(kind)
        self.state.append(self.state_id(op.state))
        self.seq.append(op.seq)
        self.record_id.append(op.record_id)
        self.created.append(op.created_ns)
        self.started.append(op.started_ns)
        self.completed.append(op.completed_ns)
        self.duration.append(op.duration_ms)
        self.core_seq.append(op.core_seq)

    def done(self) -> OpColumns:
        return OpColumns(self.rank, self.kinds, self.states, self.kind, self.state, self.seq, self.record_id,
                         self.created, self.started, self.completed, self.duration, self.core_seq)


def int_or_none(v: Any) -> int | None:
    """``v`` as an int of fewer than 512 bits, else None (see ``_INT_BOUND``)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        i = int(v)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite float
        return None
    return i if -_INT_BOUND < i < _INT_BOUND else None


def float_or_none(v: Any) -> float | None:
    """``v`` as a finite float, else None (NaN and infinities are no measurement, and the JSON
    the viewer writes has no words for them)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past a float's range
        return None
    return f if -_INF < f < _INF else None


# the entry's fields the columns read, in one C call when the entry has them all (what the
# recorder writes); defaults as ``load._parse_entry`` has them otherwise
_FIELDS = ("profiling_name", "record_id", "process_group", "pg_id", "is_p2p", "input_sizes", "input_dtypes",
           "output_sizes", "output_dtypes", "timeout_ms", "frames", "state", "collective_seq_id", "p2p_seq_id",
           "time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns", "duration_ms")
_DEFAULTS = {"record_id": 0, "state": "scheduled", "collective_seq_id": 0, "p2p_seq_id": 0}
_X_FIELDS = ("op", "error", "outcome", "peer", "root", "reduce_op", "seq", "state")
_ABSENT = object()


def columns_of_entries(entries: list[Any], rank: int, ext_ops: Any, parse_entry: Callable[[dict[str, Any]], Any],
                       malformed: Callable[[int, str], Exception]) -> OpColumns:
    """The columns of a dump's entries. ``parse_entry(e)`` is the entry-by-entry parse (used
    for each entry whose repeated part is new); ``malformed(i, why)`` makes the error for a
    bad entry ``i``. Raises what they raise, in the order the entry-by-entry parse would."""
    b = _Builder(rank)
    kind_of: dict[bytes, int] = {}
    frames_of: dict[int, int] = {}  # id(frames list) -> its content's number, while ``entries`` lives
    frames_by_content: dict[bytes, int] = {}
    ext_is_dict = isinstance(ext_ops, dict)
    state_of, kinds = b.state_of, b.kinds
    fields, xfields = itemgetter(*_FIELDS), itemgetter(*_X_FIELDS)
    add_kind, add_state, add_seq, add_rid = b.kind.append, b.state.append, b.seq.append, b.record_id.append
    add_created, add_started, add_completed = b.created.append, b.started.append, b.completed.append
    add_duration, add_core = b.duration.append, b.core_seq.append
    dumps = marshal.dumps
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise malformed(i, f"is {type(e).__name__}, not a dict")
        try:
            try:
                (prof, rid, pg, pg_id, p2p, in_s, in_d, out_s, out_d, timeout, frames, state, cseq, pseq,
                 created, started, completed, duration) = fields(e)
                has: Any = True
            except KeyError:
                prof = e["profiling_name"]
                (_, rid, pg, pg_id, p2p, in_s, in_d, out_s, out_d, timeout, frames, state, cseq, pseq, created,
                 started, completed, duration) = (e.get(f, _DEFAULTS.get(f)) for f in _FIELDS)
                has = ("pg_id" in e, "is_p2p" in e)
            if type(rid) is not int:
                rid = int(rid)
            x = ext_ops.get(str(rid)) if ext_is_dict else None
            xv: Any = None
            if isinstance(x, dict):
                try:
                    xv = xfields(x)
                except KeyError:
                    xv = tuple(x.get(f) for f in _X_FIELDS[:-1]) + (x.get("state", _ABSENT),)
            fid = frames_of.get(id(frames))
            key: bytes | None = None
            try:
                if fid is None:
                    fid = frames_of[id(frames)] = frames_by_content.setdefault(dumps(frames), len(frames_by_content))
                key = dumps((has, pg, pg_id, prof, p2p, in_s, in_d, out_s, out_d, timeout, fid,
                             None if xv is None else xv[:6]))
            except ValueError:  # a value marshal cannot write: this entry is parsed alone
                key = None
            k = kind_of.get(key) if key is not None else None
            if k is None:
                op = parse_entry(e)
                k = len(kinds)
                kinds.append(_kind_of(op))
                if key is not None:
                    kind_of[key] = k
                b.add_op(op, k)
                continue
            is_p2p = kinds[k].is_p2p
            if xv is not None and xv[7] is not _ABSENT:
                state = xv[7]
            if type(state) is not str:
                state = str(state)
            sid = state_of.get(state)
            if sid is None:
                sid = b.state_id(state)
            seq = pseq if is_p2p else cseq
            if type(seq) is not int:
                seq = int(seq)
            if is_p2p and x is not None and seq >= P2P_SEQ_BASE:
                seq -= P2P_SEQ_BASE
            # ints past ``_INT_BOUND`` and floats that are not finite: dropped by ``OpColumns``
            if type(created) is not int:
                created = int_or_none(created)
            if type(started) is not int:
                started = int_or_none(started)
            if type(completed) is not int:
                completed = int_or_none(completed)
            if type(duration) is not float:
                duration = float_or_none(duration)
            core = xv[6] if xv is not None else None
            if type(core) is not int:
                core = int_or_none(core)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise malformed(i, f"is malformed ({exc.__class__.__name__}: {exc})") from None
        add_kind(k)
        add_state(sid)
        add_seq(seq)
        add_rid(rid)
        add_created(created)
        add_started(started)
        add_completed(completed)
        add_duration(duration)
        add_core(core)
    return b.done()


def columns_of_ops(rank: int, ops: Sequence[Any]) -> OpColumns:
    """Columns of ``Op`` objects (a dump built in memory rather than read)."""
    if isinstance(ops, OpColumns):
        return ops
    b = _Builder(rank)
    kind_of: dict[bytes, int] = {}
    for op in ops:
        kind = _kind_of(op)
        try:
            key: bytes | None = marshal.dumps(tuple(kind))
        except ValueError:
            key = None
        k = kind_of.get(key) if key is not None else None
        if k is None:
            k = len(b.kinds)
            b.kinds.append(kind)
            if key is not None:
                kind_of[key] = k
        b.add_op(op, k)
    return b.done()
