"""Read flight-recorder dumps — ours and PyTorch's, pickle or JSON — into one model.

Every way a dump can be unusable (missing, empty folder, truncated, not a dump, unknown
version, two dumps for one rank, dumps of different jobs, hostile) raises
:class:`TraceInputError` with one line that says which file and what is wrong. Pickles are read
with an unpickler that refuses every global, so a dump cannot run code.

Every file is read and parsed in a worker process (:mod:`.parallel`), one per usable CPU, one
alone for fewer than a pool's worth of files, under the kernel's bounds of :mod:`.budget`: a
file whose unpickling never returns, crashes the interpreter or takes more memory than its
size allows is refused naming the file, and a parse that hands back more, spelled out, than
the file's size allows is refused in the worker. An error in a worker is reported as the same
one-line error, at its file's turn.
"""
from __future__ import annotations

import gc
import io
import json
import os
import pickle
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, NamedTuple

from torchcomms.tracing.fr_format import EXTENSION_KEY, P2P_SEQ_BASE
from torchcomms.tracing.viewer import budget
from torchcomms.tracing.viewer.columns import OpColumns, columns_of_entries, float_or_none, int_or_none
from torchcomms.tracing.viewer.parallel import (AnswerTooLarge, Limits, WorkerDied, describe_exit, ordered_map,
                                                worker_count)
from torchcomms.tracing.viewer.shared import SharedValues

_VERSION_RE = re.compile(r"^2\.\d+$")
_RANK_SUFFIX_RE = re.compile(r"(\d+)(?:\.[A-Za-z]+)?$")
_P2P_RE = re.compile(r"^(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)$")
MAX_DUMP_BYTES = 2 << 30
#: ranks past this are not ranks of a job (and would not fit the analysis' int64 arrays)
MAX_RANK = 2**31 - 1
#: a tensor dimension is an int64 (torch's sizes)
MAX_DIM = 2**63


class TraceInputError(Exception):
    """The input cannot be analysed; the message is one line naming the file and the cause."""


@dataclass
class CommMeta:
    """A communicator ("process group") as the dumps describe it."""

    name: str
    desc: str
    ranks: list[int]
    backend: str = ""


@dataclass(slots=True)
class Op:
    """One op record of one rank, normalised across dump flavours."""

    rank: int
    comm: str
    op: str
    backend: str
    seq: int  # collective_seq_id for collectives, p2p_seq_id for point-to-point
    is_p2p: bool
    record_id: int
    input_sizes: list[list[int]]
    input_dtypes: list[str]
    output_sizes: list[list[int]]
    output_dtypes: list[str]
    state: str  # scheduled | started | completed | failed | timed_out | aborted
    created_ns: int | None
    started_ns: int | None
    completed_ns: int | None
    duration_ms: float | None
    timeout_ms: int | None
    frames: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    peer: int | None = None  # comm rank of the peer (p2p)
    root: int | None = None
    reduce_op: str | None = None
    comm_rank: int | None = None
    core_seq: int | None = None  # the communicator's own sequence number (torchcomms dumps)
    # what the caller got (failed, timed_out, aborted) while the engine still ran the op: the
    # op's ``state`` is then "started" (torchcomms dumps; see ``fr_format.entry_state``)
    outcome: str | None = None

    @property
    def call_site(self) -> str:
        if not self.frames:
            return ""
        f = self.frames[0]
        return f"{f.get('filename', '?')}:{f.get('line', '?')} ({f.get('name', '?')})"

    @property
    def label(self) -> str:
        return f"{self.op} #{self.display_seq}"

    @property
    def display_seq(self) -> int:
        return self.core_seq if self.core_seq is not None else self.seq

    @property
    def finished(self) -> bool:
        return self.state in ("completed", "failed", "timed_out", "aborted")


@dataclass
class RankDump:
    """One rank's dump."""

    path: str
    rank: int
    version: str
    source: str  # "torchcomms" | "pytorch"
    comms: dict[str, CommMeta]
    ops: Sequence[Op]  # an OpColumns when read from a file
    run_id: str | None = None
    host: str | None = None
    pid: int | None = None
    reason: str | None = None
    dumped_at_ns: int | None = None
    world_size: int | None = None


@dataclass
class TraceSet:
    """All dumps of one job, by rank."""

    dumps: dict[int, RankDump]
    _table: Any = field(default=None, init=False, repr=False, compare=False)

    def table(self) -> Any:
        """Every op in arrays (:class:`~.align.Table`), made once (the dumps are not changed)."""
        if self._table is None:
            from torchcomms.tracing.viewer.align import Table

            self._table = Table({r: d.ops for r, d in self.dumps.items()})
        return self._table

    @property
    def ranks(self) -> list[int]:
        return sorted(self.dumps)

    @property
    def run_id(self) -> str | None:
        ids = {d.run_id for d in self.dumps.values() if d.run_id}
        return next(iter(ids)) if len(ids) == 1 else None

    def comms(self) -> dict[str, CommMeta]:
        """Communicators across dumps; PyTorch dumps without ``pg_config`` get the dump ranks."""
        out: dict[str, CommMeta] = {}
        used_by = {r: _comm_backends(d.ops) for r, d in self.dumps.items()}
        used = {c for comms in used_by.values() for c in comms}
        for d in self.dumps.values():
            for name, meta in d.comms.items():
                if not name and name not in used:
                    continue  # PyTorch gloo dumps carry an empty, unreferenced pg_config entry
                cur = out.get(name)
                if cur is None:
                    out[name] = CommMeta(name, meta.desc, list(meta.ranks), meta.backend)
                elif not cur.ranks and meta.ranks:
                    cur.ranks = list(meta.ranks)
        for r in self.dumps:
            for comm, backend in used_by[r].items():
                if comm not in out:
                    out[comm] = CommMeta(comm, comm, [], backend)
        for meta in out.values():
            if not meta.ranks:
                meta.ranks = sorted(r for r in self.dumps if meta.name in used_by[r])
        return out

    def all_ops(self) -> Iterable[Op]:
        for r in self.ranks:
            yield from self.dumps[r].ops


def _comm_backends(ops: Sequence[Op]) -> dict[str, str]:
    """``{comm: backend of its first op}`` in the order the comms first appear in ``ops``."""
    if isinstance(ops, OpColumns):
        return ops.comm_backends()
    out: dict[str, str] = {}
    for o in ops:
        out.setdefault(o.comm, o.backend)
    return out


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a dump holds only plain data")


def _read_raw(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TraceInputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if size == 0:
        raise TraceInputError(f"{path}: empty file, not a flight-recorder dump")
    if size > MAX_DUMP_BYTES:
        raise TraceInputError(f"{path}: {size} bytes is too large for a flight-recorder dump")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceInputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    head = data.lstrip()[:1]
    if head in (b"{",):
        try:
            obj = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TraceInputError(f"{path}: truncated or corrupt JSON dump ({exc.__class__.__name__}: {exc})") from None
        except ValueError as exc:  # an integer of more digits than Python converts
            raise TraceInputError(f"{path}: not a flight-recorder dump ({exc})") from None
        except RecursionError:
            raise TraceInputError(f"{path}: not a flight-recorder dump (its JSON nests too deeply to read)") from None
    elif data[:1] == b"\x80":
        try:
            obj = _SafeUnpickler(io.BytesIO(data)).load()
        except EOFError:
            raise TraceInputError(f"{path}: truncated pickle dump (ran out of data)") from None
        except (pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
            raise TraceInputError(f"{path}: corrupt pickle dump ({exc})") from None
    else:
        raise TraceInputError(f"{path}: not a flight-recorder dump (neither a pickle nor JSON)")
    if not isinstance(obj, dict):
        raise TraceInputError(f"{path}: not a flight-recorder dump (top level is {type(obj).__name__}, not a dict)")
    return obj


def _sizes(v: Any) -> list[list[int]]:
    if not isinstance(v, (list, tuple)):
        return []
    out = []
    for s in v:
        if isinstance(s, (list, tuple)):
            dims = (int_or_none(x) for x in s if isinstance(x, (int, float)) and not isinstance(x, bool))
            out.append([d for d in dims if d is not None and 0 <= d < MAX_DIM])
    return out


def _strs(v: Any) -> list[str]:
    return [str(x) for x in v] if isinstance(v, (list, tuple)) else []


def _frames(v: Any) -> list[dict[str, Any]]:
    """The call stack's frames, each with its str keys whose values are a str or an int."""
    if not isinstance(v, (list, tuple)):
        return []
    return [{k: x for k, x in f.items() if isinstance(k, str) and (
        isinstance(x, str) or (type(x) is int and int_or_none(x) is not None))}
        for f in v if isinstance(f, dict)]


def _parse_ranks(v: Any) -> list[int] | None:
    """A communicator's ranks (a list, or PyTorch's string of one); ``[]`` when unknown, ``None``
    for a list that holds something other than ints."""
    if isinstance(v, (list, tuple)):
        if not all(type(x) is int for x in v):
            return None
        return list(v)
    if isinstance(v, str):
        s = v.strip().strip("[]() ")
        if not s:
            return []
        try:
            return [int(x) for x in s.split(",") if x.strip()]
        except ValueError:
            return []
    return []


def parse_dump(obj: dict[str, Any], path: str, rank_hint: int | None,
               shared: SharedValues | None = None) -> RankDump:
    """Validate and normalise one decoded dump."""
    try:
        return _parse_dump(obj, path, rank_hint, shared)
    except (ValueError, OverflowError) as exc:  # e.g. a name that is an int of 5,000 digits
        raise TraceInputError(f"{path}: not a flight-recorder dump ({type(exc).__name__}: {exc})") from None
    except RecursionError:  # a name that is a list nested thousands deep, spelled out
        raise TraceInputError(f"{path}: not a flight-recorder dump (a value nests too deeply to read)") from None


def _parse_dump(obj: dict[str, Any], path: str, rank_hint: int | None,
                shared: SharedValues | None) -> RankDump:
    if "entries" not in obj or "version" not in obj:
        missing = [k for k in ("version", "entries") if k not in obj]
        raise TraceInputError(f"{path}: not a flight-recorder dump (no {', '.join(missing)})")
    version = str(obj["version"])
    if not _VERSION_RE.match(version):
        raise TraceInputError(f"{path}: unknown flight-recorder format version {version!r} (this reads 2.x)")
    entries = obj["entries"]
    if not isinstance(entries, list):
        raise TraceInputError(f"{path}: 'entries' is {type(entries).__name__}, not a list")
    ext = obj.get(EXTENSION_KEY) if isinstance(obj.get(EXTENSION_KEY), dict) else None
    rank = int_or_none(ext.get("rank")) if ext else None
    if rank is None:
        rank = int_or_none(obj.get("rank"))
    if rank is None:
        rank = rank_hint
    if rank is None or rank < 0:
        raise TraceInputError(f"{path}: cannot tell which rank wrote this dump (no rank inside, no number at the end of the file name)")
    if rank > MAX_RANK:
        raise TraceInputError(f"{path}: rank {rank} is out of range (at most {MAX_RANK})")
    ext_comms = ext.get("comms") if ext else None
    if not isinstance(ext_comms, dict):
        ext_comms = {}
    comms: dict[str, CommMeta] = {}
    pg_config = obj.get("pg_config") or {}
    if isinstance(pg_config, dict):
        for key, cfg in pg_config.items():
            if not isinstance(cfg, dict):
                continue
            name = str(key)
            backend = ""
            if isinstance(ext_comms.get(name), dict):
                backend = str(ext_comms[name].get("backend", ""))
            ranks = _parse_ranks(cfg.get("ranks"))
            if ranks is None:
                raise TraceInputError(f"{path}: pg_config of communicator {name[:64]!r}: 'ranks' is not a list of ints")
            comms[name] = CommMeta(name, str(cfg.get("desc", name)), ranks, backend)
    ext_ops = ext.get("ops", {}) if ext else {}
    shared = shared if shared is not None else SharedValues()
    ops = columns_of_entries(
        entries, rank, ext_ops, lambda e: _parse_entry(e, rank, ext_ops, comms, shared),
        lambda i, why: TraceInputError(f"{path}: entry {i} {why}"))
    return RankDump(
        path=path,
        rank=rank,
        version=version,
        source="torchcomms" if ext else "pytorch",
        comms=comms,
        ops=ops,
        run_id=str(ext["run_id"]) if ext and ext.get("run_id") is not None else None,
        host=str(ext["host"]) if ext and ext.get("host") else None,
        pid=int_or_none(ext.get("pid")) if ext else None,
        reason=str(ext["reason"]) if ext and ext.get("reason") else None,
        dumped_at_ns=int_or_none(ext.get("dumped_at_ns")) if ext else None,
        world_size=int_or_none(ext.get("world_size")) if ext else None,
    )


def _parse_entry(e: dict[str, Any], rank: int, ext_ops: dict[str, Any], comms: dict[str, CommMeta],
                 shared: SharedValues) -> Op:
    pg = e.get("process_group")
    comm = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(e.get("pg_id", "?"))
    prof = str(e["profiling_name"])
    backend, _, opname = prof.partition(":") if ":" in prof else ("", "", prof)
    peer = None
    comm_rank = None
    m = _P2P_RE.match(opname.strip())
    if m:
        kind, a, arrow, b = m.groups()
        opname = kind
        comm_rank, peer = int(a), int(b)
    else:
        opname = opname.strip().split(" ")[0]
    is_p2p = bool(e.get("is_p2p", opname in ("send", "recv")))
    state = str(e.get("state", "scheduled"))
    record_id = int(e.get("record_id", 0))
    x = ext_ops.get(str(record_id)) if isinstance(ext_ops, dict) else None
    error = root = reduce_op = core_seq = outcome = None
    if isinstance(x, dict):
        state = str(x.get("state", state))
        error = x.get("error")
        outcome = str(x["outcome"]) if x.get("outcome") else None
        peer = int_or_none(x.get("peer")) if x.get("peer") is not None else peer
        root = int_or_none(x.get("root"))
        reduce_op = x.get("reduce_op")
        core_seq = int_or_none(x.get("seq"))
        if x.get("op"):
            opname = str(x["op"])
    if comm_rank is None and comm in comms and rank in comms[comm].ranks:
        comm_rank = comms[comm].ranks.index(rank)
    seq = int(e.get("p2p_seq_id", 0) if is_p2p else e.get("collective_seq_id", 0))
    if is_p2p and x is not None and seq >= P2P_SEQ_BASE:
        seq -= P2P_SEQ_BASE  # our dumps offset p2p numbers (see fr_format.P2P_SEQ_BASE)
    return Op(
        rank=rank,
        comm=comm,
        op=opname,
        backend=backend,
        seq=seq,
        is_p2p=is_p2p,
        record_id=record_id,
        input_sizes=shared.get("sizes", e.get("input_sizes"), _sizes),
        input_dtypes=shared.get("strs", e.get("input_dtypes"), _strs),
        output_sizes=shared.get("sizes", e.get("output_sizes"), _sizes),
        output_dtypes=shared.get("strs", e.get("output_dtypes"), _strs),
        state=state,
        created_ns=int_or_none(e.get("time_created_ns")),
        started_ns=int_or_none(e.get("time_discovered_started_ns")),
        completed_ns=int_or_none(e.get("time_discovered_completed_ns")),
        duration_ms=float_or_none(e.get("duration_ms")),
        timeout_ms=int_or_none(e.get("timeout_ms")),
        frames=shared.get("frames", e.get("frames") or [], _frames),
        error=str(error) if error else None,
        peer=peer,
        root=root,
        reduce_op=str(reduce_op) if reduce_op else None,
        comm_rank=comm_rank,
        core_seq=core_seq,
        outcome=outcome,
    )


def _expand(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    if not paths:
        raise TraceInputError("no dumps given")
    files: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(c for c in path.iterdir() if c.is_file() and not c.name.startswith("."))
            if not found:
                raise TraceInputError(f"{path}: folder holds no dump files")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise TraceInputError(f"{path}: no such file or folder")
    return files


class _Job(NamedTuple):
    """One file to read: its path, the rank its name gives, its size and its worker's bounds."""

    path: str
    hint: int | None
    size: int
    limits: Limits


def _read_dump(job: _Job) -> RankDump:
    """One file, read and parsed (a worker process's job), refused if it needs more memory than
    its bounds or hands back more, spelled out, than its size allows (:mod:`.budget`). The
    cyclic garbage collector waits meanwhile: a dump is millions of fresh containers, freed by
    reference counts, and a collection pass over them costs about a fifth of the parse."""
    was = gc.isenabled()
    gc.disable()
    try:
        dump = parse_dump(_read_raw(Path(job.path)), job.path, job.hint)
        allowed = budget.spelled_out_budget(job.size)
        if budget.spelled_out(dump) > allowed:
            raise TraceInputError(
                f"{job.path}: not a flight-recorder dump (it refers to its own values so often that it spells out to "
                f"more than {_mib(allowed)}; a dump of {job.size} bytes spells out to far less)")
        return dump
    except MemoryError:
        mib = _mib(job.limits.memory_bytes) if job.limits.memory_bytes is not None else "the memory there is"
        raise TraceInputError(f"{job.path}: not a flight-recorder dump (reading it needs more than {mib} of memory; "
                              f"a dump of {job.size} bytes needs far less)") from None
    finally:
        if was:
            gc.enable()


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _died(job: _Job, exc: WorkerDied) -> TraceInputError:
    """The one-line error for a file whose worker the kernel ended, or that crashed it."""
    if exc.out_of_cpu:
        return TraceInputError(f"{job.path}: not a flight-recorder dump (reading it took more than "
                               f"{job.limits.cpu_s} s of CPU; a dump of {job.size} bytes takes well under one)")
    how = describe_exit(exc.exitcode) + (f" {exc.where}" if exc.where else "")
    return TraceInputError(f"{job.path}: not a flight-recorder dump (the process reading it {how})")


def load_dumps(paths: Sequence[str | os.PathLike[str]],
               progress: Callable[[int, int], object] | None = None, *, workers: int | None = None,
               cpu_s: int | None = None) -> TraceSet:
    """Load per-rank dumps (files or folders of them) of one job; ``progress(done, total)``
    hears about every file read. Files are parsed in ``workers`` processes (default: one per
    usable CPU; one for fewer files than a pool's worth), each bounded (:mod:`.budget`; ``cpu_s``:
    the CPU seconds one file may take, in place of the budget's)."""
    dumps: dict[int, RankDump] = {}
    files = _expand(paths)
    n = worker_count(workers, len(files))
    jobs: list[_Job] = []
    for path in files:
        m = _RANK_SUFFIX_RE.search(path.name)
        try:
            size = path.stat().st_size
        except OSError:
            size = 0  # the worker names what is wrong
        jobs.append(_Job(str(path), int(m.group(1)) if m else None, size, budget.limits_for(size, n, cpu_s)))
    results = ordered_map(_read_dump, jobs, n, limits=attrgetter("limits"))
    try:
        for done, (path, d) in enumerate(zip(files, results), 1):
            if d.rank in dumps:
                raise TraceInputError(f"{path}: a second dump for rank {d.rank} (first: {dumps[d.rank].path})")
            dumps[d.rank] = d
            if progress is not None:
                progress(done, len(files))
    except WorkerDied as exc:
        raise _died(exc.item, exc) from None
    except AnswerTooLarge as exc:
        raise TraceInputError(f"{exc.item.path}: not a flight-recorder dump (parsed, it takes {_mib(exc.size)}, more "
                              f"than the {_mib(exc.limits.answer_bytes or 0)} allowed a dump of {exc.item.size} "
                              "bytes)") from None
    finally:
        results.close()  # stops the workers when an error ends the loop early
    run_ids = {d.run_id for d in dumps.values() if d.run_id is not None}
    if len(run_ids) > 1:
        by = ", ".join(f"rank {r}: {dumps[r].run_id}" for r in sorted(dumps) if dumps[r].run_id)
        raise TraceInputError(f"dumps come from different jobs (run ids differ: {by})")
    return TraceSet(dumps)
