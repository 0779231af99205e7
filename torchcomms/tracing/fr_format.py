"""PyTorch flight-recorder dump format "2.10": build, serialise and write dumps.

A dump is a plain ``dict`` of builtin types so that both ``pickle`` (files, what PyTorch's
``fr_trace`` analyzer reads) and JSON (``dump_json``, the debug endpoints) can carry it.
Beyond PyTorch's keys, a dump has a ``"torchcomms"`` section (run id, rank, host, why it was
written, per-op extras such as the communicator's own sequence number and the error text);
PyTorch's tools ignore it.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import re
import socket
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = "2.10"
"""The PyTorch flight-recorder format version these dumps follow."""

EXTENSION_KEY = "torchcomms"
"""Top-level key of the torchcomms-specific section of a dump."""

EXTENSION_FORMAT = 1

DEFAULT_DUMP_ROOT = "~/.cache/torch/comm_lib_trace"
"""Where dumps go when ``TORCHCOMM_FR_DUMP_TEMP_FILE`` is unset: ``<root>/<run id>/rank_<r>``."""
DUMP_PREFIX_ENV = "TORCHCOMM_FR_DUMP_TEMP_FILE"

# States PyTorch's format knows; ours map onto them (the precise one stays in the extension).
FR_STATES = ("scheduled", "started", "completed")
TERMINAL_STATES = frozenset({"completed", "failed", "timed_out", "aborted"})
# Outcomes a caller can get while the engine still runs the op (its deadline passed, a peer
# failure or an abort ended it for the caller): the op is then written "started", still in
# the engine, with the caller's outcome beside it, never as failed (see ``entry_state``).
CALLER_FAILURES = frozenset({"failed", "timed_out", "aborted"})


def entry_state(state: str, in_engine: bool) -> tuple[str, str | None]:
    """``(state, outcome)`` a dump writes for an op whose record says ``state``: an op the
    caller was failed out of while the engine has not returned from it is ``"started"``, with
    the caller's ``state`` as its outcome; any other op is its own state, without one."""
    if in_engine and state in CALLER_FAILURES:
        return "started", state
    return state, None

# p2p_seq_id values are written offset by this base. PyTorch's analyzer
# (find_coalesced_group_with_non_p2p) treats consecutive entries of one group as a coalesced
# batch when a p2p entry's p2p_seq_id equals another entry's collective_seq_id, so a
# `send` right after collective #1 would be mistaken for part of it and the analysis fails.
# Disjoint number ranges keep the order and rule that out; readers subtract the base.
P2P_SEQ_BASE = 1 << 32

# Op names PyTorch's analyzer accepts after "<backend>:"; ours that it lacks are mapped.
_FR_OP_ALIASES = {"batch_p2p": "coalesced", "shrink": "split"}


@dataclass(frozen=True)
class CommInfo:
    """What a dump needs to know about one communicator (a PyTorch "process group")."""

    name: str
    ranks: tuple[int, ...]
    rank: int
    backend: str
    desc: str = ""
    parent: str | None = None

    def pg_config(self) -> dict[str, Any]:
        """The ``pg_config`` value PyTorch's analyzer expects (``ranks`` as a string)."""
        return {"name": self.name, "desc": self.desc or self.name, "ranks": str(list(self.ranks))}


@dataclass
class EntryView:
    """One op record flattened to the fields of a dump entry (the writer's input)."""

    record_id: int
    comm: CommInfo
    op: str
    seq: int
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    is_p2p: bool
    peer: int | None
    root: int | None
    reduce_op: str | None
    input_sizes: list[list[int]]
    input_dtypes: list[str]
    output_sizes: list[list[int]]
    output_dtypes: list[str]
    timeout_s: float | None
    time_created_ns: int
    time_started_ns: int | None
    time_completed_ns: int | None
    state: str
    error: str | None
    thread_name: str
    thread_id: int
    frames: list[dict[str, Any]] = field(default_factory=list)
    device_duration_ms: float | None = None  # from the op's device events (stream-ordered engines)
    outcome: str | None = None  # what the caller got while the engine still runs the op
    in_engine: bool = False


def profiling_name(backend: str, op: str, is_p2p: bool, rank: int, peer: int | None) -> str:
    """``"<backend>:<op>"``; point-to-point ops add ``"src->dst"``/``"dst<-src"`` (group ranks)."""
    name = _FR_OP_ALIASES.get(op, op)
    if is_p2p and peer is not None and name in ("send", "recv"):
        suffix = f"{rank}->{peer}" if name == "send" else f"{rank}<-{peer}"
        return f"{backend}:{name} {suffix}"
    return f"{backend}:{name}"


def fr_state(state: str, time_started_ns: int | None) -> str:
    """Map our op state onto PyTorch's three (a failed op never completed)."""
    if state in FR_STATES:
        return state
    return "started" if time_started_ns else "scheduled"


def entry_dict(e: EntryView) -> dict[str, Any]:
    """The PyTorch "2.10" entry for one op."""
    completed = e.state == "completed"
    duration_ms: float | None = None
    if completed and e.device_duration_ms is not None:  # measured by the device's events, as PyTorch's
        duration_ms = e.device_duration_ms
    elif completed and e.time_completed_ns and (e.time_started_ns or e.time_created_ns):
        start = e.time_started_ns or e.time_created_ns
        duration_ms = max(0, e.time_completed_ns - start) / 1e6
    return {
        "record_id": e.record_id,
        "pg_id": e.comm.name,
        "process_group": [e.comm.name, e.comm.desc or e.comm.name],
        "thread_name": e.thread_name,
        "thread_id": str(e.thread_id),
        "collective_seq_id": e.collective_seq_id,
        "p2p_seq_id": P2P_SEQ_BASE + e.p2p_seq_id if e.p2p_seq_id else 0,
        "op_id": e.op_id,
        "profiling_name": profiling_name(e.comm.backend, e.op, e.is_p2p, e.comm.rank, e.peer),
        "time_created_ns": e.time_created_ns,
        "duration_ms": duration_ms,
        "input_sizes": e.input_sizes,
        "input_dtypes": e.input_dtypes,
        "output_sizes": e.output_sizes,
        "output_dtypes": e.output_dtypes,
        "state": fr_state(e.state, e.time_started_ns),
        "time_discovered_started_ns": e.time_started_ns,
        "time_discovered_completed_ns": e.time_completed_ns if completed else None,
        "retired": e.state in TERMINAL_STATES,
        "timeout_ms": int(round(e.timeout_s * 1000)) if e.timeout_s is not None else 0,
        "is_p2p": e.is_p2p,
        "frames": e.frames,
    }


def extension_op(e: EntryView) -> dict[str, Any]:
    """The torchcomms-only facts about an op, keyed by ``record_id`` in the extension."""
    return {
        "op": e.op,
        "seq": e.seq,
        "state": e.state,
        "outcome": e.outcome,
        "in_engine": e.in_engine,
        "error": e.error,
        "peer": e.peer,
        "root": e.root,
        "reduce_op": e.reduce_op,
        "device_duration_ms": e.device_duration_ms,
    }


def pg_status(entries: Iterable[EntryView], comms: Iterable[CommInfo]) -> dict[str, dict[str, int]]:
    """``{comm: {last_enqueued_collective, last_started_collective, last_completed_collective}}``."""
    status = {
        c.name: {"last_enqueued_collective": -1, "last_started_collective": -1, "last_completed_collective": -1}
        for c in comms
    }
    for e in entries:
        if e.is_p2p:
            continue
        s = status.setdefault(
            e.comm.name,
            {"last_enqueued_collective": -1, "last_started_collective": -1, "last_completed_collective": -1},
        )
        seq = e.collective_seq_id
        s["last_enqueued_collective"] = max(s["last_enqueued_collective"], seq)
        if e.time_started_ns or e.state in ("started", "completed"):
            s["last_started_collective"] = max(s["last_started_collective"], seq)
        if e.state == "completed":
            s["last_completed_collective"] = max(s["last_completed_collective"], seq)
    return status


@dataclass(frozen=True)
class DumpContext:
    """Who wrote a dump and why."""

    rank: int
    world_size: int | None
    run_id: str
    reason: str
    comm_lib_version: str
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)


def build_dump(
    entries: list[EntryView],
    comms: Iterable[CommInfo],
    ctx: DumpContext,
    *,
    include_completed: bool = True,
) -> dict[str, Any]:
    """Assemble a full "2.10" dump from entries (oldest first) and the known communicators.

    ``pg_config`` lists every communicator known to the recorder and every one an entry
    names, so PyTorch's analyzer never meets an unknown group.
    """
    comm_map: dict[str, CommInfo] = {c.name: c for c in comms}
    for e in entries:
        comm_map.setdefault(e.comm.name, e.comm)
    status = pg_status(entries, comm_map.values())
    kept = [e for e in entries if include_completed or e.state != "completed"]
    return {
        "version": FORMAT_VERSION,
        "comm_lib_version": ctx.comm_lib_version,
        "pg_config": {name: c.pg_config() for name, c in comm_map.items()},
        "pg_status": status,
        "entries": [entry_dict(e) for e in kept],
        EXTENSION_KEY: {
            "format": EXTENSION_FORMAT,
            "run_id": ctx.run_id,
            "rank": ctx.rank,
            "world_size": ctx.world_size,
            "host": ctx.host,
            "pid": ctx.pid,
            "reason": ctx.reason,
            "dumped_at_ns": time.time_ns(),
            "comms": {
                name: {
                    "backend": c.backend,
                    "ranks": list(c.ranks),
                    "rank": c.rank,
                    "parent": c.parent,
                }
                for name, c in comm_map.items()
            },
            "ops": {str(e.record_id): extension_op(e) for e in kept},
        },
    }


def to_json(dump: Mapping[str, Any]) -> str:
    """Serialise a dump as JSON (what ``dump_json`` and the debug endpoint return)."""
    return json.dumps(dump, separators=(",", ":"), default=str)


def to_pickle(dump: Mapping[str, Any]) -> bytes:
    """Serialise a dump as a pickle of builtin types only (what PyTorch's analyzer reads)."""
    buf = io.BytesIO()
    pickle.Pickler(buf, protocol=4).dump(dict(dump))
    return buf.getvalue()


def default_dump_prefix() -> str:
    """``~/.cache/torch/comm_lib_trace/<job id>/rank_``: one folder per job, so concurrent jobs
    on one machine never overwrite each other's dumps (``config.Settings.job_id``)."""
    from torchcomms.config import settings

    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", settings().job_id).lstrip(".") or "local"
    return f"{DEFAULT_DUMP_ROOT}/{safe}/rank_"


def dump_path(rank: int, prefix: str | None = None) -> Path:
    """``<prefix><rank>``; the prefix is ``TORCHCOMM_FR_DUMP_TEMP_FILE``, else
    :func:`default_dump_prefix` (per job)."""
    if prefix is None:
        from torchcomms.config import settings

        prefix = settings().fr_dump_prefix or default_dump_prefix()
    return Path(os.path.expanduser(f"{prefix}{int(rank)}"))


def _umask() -> int:
    """The process's umask, read without setting it (``os.umask`` would, for every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def write_atomic(path: Path, data: bytes, *, create_parents: bool = True) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename,
    so a reader never sees half a dump; the file gets the permissions open() gives (the
    umask applies). Missing parent folders are created unless
    ``create_parents`` is False (then ``FileNotFoundError``)."""
    if create_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        raise FileNotFoundError(2, "no such folder", str(path.parent))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it: mkstemp's file is 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path
