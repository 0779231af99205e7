"""The flight recorder: a bounded per-process ring buffer of op records fed by the dispatch
path's hooks, dumped in PyTorch's flight-recorder format.

Cost on the hot path is one small list, a counter bump, a short walk up the call stack for
the call site, and a deque append; everything else (flattening, serialising) happens only
when a dump is asked for. The ring keeps a reference to the core's ``OpRecord`` and reads its
(mutated) state when dumping, so the post-hook only has to notice failures.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import weakref
from threading import get_ident
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from torchcomms import config
from torchcomms.config import settings
from torchcomms.tracing import fr_format
from torchcomms.tracing.fr_format import CommInfo, DumpContext, EntryView

MAX_ENTRIES_ENV = "TORCHCOMM_FR_MAX_ENTRIES"
STACK_DEPTH_ENV = "TORCHCOMM_FR_STACK_DEPTH"
DEFAULT_MAX_ENTRIES = 2048
DEFAULT_STACK_DEPTH = 1

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAILURE_STATES = frozenset({"failed", "timed_out"})


def _opt(rec: Any, name: str, default: Any = None) -> Any:
    return getattr(rec, name, default)


def _dtype_name(d: Any) -> str:
    s = str(d)
    return s[6:] if s.startswith("torch.") else s


def _sizes(value: Any) -> list[list[int]]:
    if not value:
        return []
    return [list(map(int, s)) for s in value]


def global_rank_from_env() -> int | None:
    if settings().rank is not None:
        return settings().rank
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK", "SLURM_PROCID"):
        v = os.environ.get(var)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


def world_size_from_env() -> int | None:
    if settings().size is not None:
        return settings().size
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE", "SLURM_NTASKS"):
        v = os.environ.get(var)
        if v is not None and v.strip().isdigit():
            return int(v)
    return None


class _CommTrack:
    """A communicator the recorder has seen, with its own collective / p2p counters."""

    __slots__ = ("info", "coll_seq", "p2p_seq")

    def __init__(self, info: CommInfo) -> None:
        self.info = info
        self.coll_seq = 0
        self.p2p_seq = 0


def comm_info_from_record(rec: Any) -> CommInfo:
    """Build a :class:`CommInfo` from the fields an ``OpRecord`` carries."""
    size = int(_opt(rec, "size", 1) or 1)
    ranks = _opt(rec, "comm_ranks")
    ranks_t = tuple(int(r) for r in ranks) if ranks else tuple(range(size))
    return CommInfo(
        name=str(_opt(rec, "comm_name", "default")),
        ranks=ranks_t,
        rank=int(_opt(rec, "rank", 0) or 0),
        backend=str(_opt(rec, "backend", "unknown")),
    )


def comm_info_from_comm(comm: Any, parent: str | None = None) -> CommInfo:
    """Build a :class:`CommInfo` from a live communicator (``get_name``/``get_rank``/...)."""
    name = str(comm.get_name())
    rank = int(comm.get_rank())
    size = int(comm.get_size())
    ranks: Any = None
    for attr in ("global_ranks", "get_global_ranks", "comm_ranks", "ranks"):
        v = getattr(comm, attr, None)
        if v is None:
            continue
        v = v() if callable(v) else v
        if v is not None:
            ranks = v
            break
    ranks_t = tuple(int(r) for r in ranks) if ranks else tuple(range(size))
    try:
        backend = str(comm.get_backend())
    except Exception:  # noqa: BLE001 - a comm without a backend name still gets recorded
        backend = "unknown"
    return CommInfo(name=name, ranks=ranks_t, rank=rank, backend=backend, parent=parent)


class FlightRecorder:
    """A bounded ring of op records plus the communicators they belong to.

    Thread-safe for concurrent ops (the ring is a ``deque`` with ``maxlen``; appends are
    atomic). ``max_entries=0`` disables recording.
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, *, stack_depth: int | None = None) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int):
            raise TypeError(f"max_entries must be an int, got {type(max_entries).__name__}")
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0, got {max_entries}")
        if stack_depth is None:
            stack_depth = _env_int(STACK_DEPTH_ENV, DEFAULT_STACK_DEPTH)
        if stack_depth < 0:
            raise ValueError(f"stack_depth must be >= 0, got {stack_depth}")
        self.max_entries = max_entries
        self.stack_depth = stack_depth
        self._ring: deque[tuple[Any, ...]] = deque(maxlen=max_entries or 1)
        self._tracks: dict[str, _CommTrack] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._attached: dict[int, tuple[weakref.ref[Any], list[Any], Any]] = {}
        self._failure_listeners: list[Callable[[str, Any], None]] = []
        self.global_rank: int | None = None
        self.world_size: int | None = None

    # -- state ---------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def size(self) -> int:
        """Number of records currently held."""
        return len(self._ring) if self.enabled else 0

    def reset(self) -> None:
        """Drop every record (communicators stay known)."""
        with self._lock:
            self._ring.clear()

    def ensure_capacity(self, max_entries: int) -> None:
        """Grow the ring to hold at least ``max_entries`` records (never shrinks it)."""
        if max_entries <= self.max_entries:
            return
        with self._lock:
            self._ring = deque(self._ring, maxlen=max_entries)
            self.max_entries = max_entries

    def add_failure_listener(self, cb: Callable[[str, Any], None]) -> None:
        """``cb(reason, record)`` runs after an op fails or times out (auto-dumps use it)."""
        self._failure_listeners.append(cb)

    # -- communicators ---------------------------------------------------------------------
    def register_comm_info(self, info: CommInfo) -> None:
        with self._lock:
            track = self._tracks.get(info.name)
            if track is None:
                self._tracks[info.name] = _CommTrack(info)
            else:
                track.info = info
        if self.global_rank is None and info.ranks:
            self.global_rank = info.ranks[info.rank] if 0 <= info.rank < len(info.ranks) else None

    def is_attached(self, comm: Any) -> bool:
        item = self._attached.get(id(comm))
        return item is not None and item[0]() is comm

    def attach(self, comm: Any, parent: str | None = None) -> bool:
        """Register the hooks on ``comm`` (once) and follow comms split from it later.

        Returns False when already attached or disabled.
        """
        if not self.enabled or self.is_attached(comm):
            return False
        try:
            self.register_comm_info(comm_info_from_comm(comm, parent))
        except Exception:  # noqa: BLE001 - learn it from the first record instead
            pass
        handles = [comm.register_pre_hook(self.pre_hook), comm.register_post_hook(self.post_hook)]
        observer = _SplitFollower(self, comm)
        add_observer = getattr(comm, "add_observer", None)
        if add_observer is not None:
            add_observer(observer)
        self._attached[id(comm)] = (weakref.ref(comm), handles, observer)
        return True

    def detach(self, comm: Any) -> None:
        """Remove the hooks from ``comm`` (records stay)."""
        item = self._attached.get(id(comm))
        if item is None or item[0]() is not comm:
            return
        del self._attached[id(comm)]
        _, handles, observer = item
        for h in handles:
            h.remove()
        remove_observer = getattr(comm, "remove_observer", None)
        if remove_observer is not None:
            remove_observer(observer)

    def comm_infos(self) -> list[CommInfo]:
        # No lock: a dump may run inside a signal handler that interrupted a lock holder.
        return [t.info for t in list(self._tracks.values())]

    # -- hot path ---------------------------------------------------------------------------
    def pre_hook(self, name: Any, op_id: int, rec: Any) -> None:
        """Pre-hook ``cb(name, op_id, OpRecord)``: append a record to the ring."""
        if not self.max_entries:
            return
        track = self._tracks.get(rec.comm_name)
        if track is None:
            self.register_comm_info(comm_info_from_record(rec))
            track = self._tracks[rec.comm_name]
        # The core numbers collectives and p2p ops separately per communicator (from 1);
        # a p2p entry carries the last collective seq, as PyTorch's recorder does.
        if rec.is_p2p:
            track.p2p_seq = rec.seq
        else:
            track.coll_seq = rec.seq
        # The call site: the first frames outside torchcomms, kept as (code object, line);
        # strings are only built when dumping.
        frames: tuple[tuple[Any, int], ...] = ()
        depth = self.stack_depth
        if depth:
            f: Any = sys._getframe(1)
            pkg = _PACKAGE_DIR
            while f is not None and f.f_code.co_filename.startswith(pkg):
                f = f.f_back
            if f is not None:
                if depth == 1:
                    frames = ((f.f_code, f.f_lineno),)
                else:
                    collected = []
                    while f is not None and len(collected) < depth:
                        collected.append((f.f_code, f.f_lineno))
                        f = f.f_back
                    frames = tuple(collected)
        self._ring.append((rec, next(self._ids), track, track.coll_seq, track.p2p_seq, frames, get_ident()))

    def post_hook(self, op_id: int, rec: Any) -> None:
        """Post-hook ``cb(op_id, OpRecord)``: the ring already holds ``rec`` (updated in
        place by the core); only failures need action (listeners write dumps)."""
        if rec.state in FAILURE_STATES and self._failure_listeners:
            for cb in list(self._failure_listeners):
                cb(str(rec.state), rec)

    # -- dumps ------------------------------------------------------------------------------
    def entries(self) -> list[EntryView]:
        """The held records, oldest first, flattened for the dump writer."""
        if not self.enabled:
            return []
        raw: list[tuple[Any, ...]] = []
        for _ in range(10):  # no lock (signal handlers dump); retry if mutated mid-copy
            try:
                raw = list(self._ring)
                break
            except RuntimeError:
                continue
        names = {t.ident: t.name for t in threading.enumerate()}
        return [_view(e, names) for e in raw]

    def dump(self, *, reason: str = "requested", include_completed: bool = True, rank: int | None = None) -> dict[str, Any]:
        """The dump as a dict (format "2.10" plus the torchcomms section)."""
        from torchcomms import __version__

        if rank is None:
            rank = self.global_rank if self.global_rank is not None else global_rank_from_env()
        ctx = DumpContext(
            rank=int(rank) if rank is not None else 0,
            world_size=self.world_size if self.world_size is not None else world_size_from_env(),
            run_id=settings().job_id,
            reason=reason,
            comm_lib_version=f"torchcomms {__version__}",
        )
        return fr_format.build_dump(self.entries(), self.comm_infos(), ctx, include_completed=include_completed)

    def dump_json(self, include_completed: bool = True, *, reason: str = "requested") -> str:
        return fr_format.to_json(self.dump(reason=reason, include_completed=include_completed))

    def dump_file(
        self, rank: int | None = None, include_completed: bool = True, *, reason: str = "requested", prefix: str | None = None
    ) -> Path:
        """Write the pickle dump atomically to ``<TORCHCOMM_FR_DUMP_TEMP_FILE><rank>``."""
        if rank is None:
            rank = self.global_rank if self.global_rank is not None else (global_rank_from_env() or 0)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be a non-negative int, got {rank!r}")
        data = fr_format.to_pickle(self.dump(reason=reason, include_completed=include_completed, rank=rank))
        return fr_format.write_atomic(fr_format.dump_path(rank, prefix), data)


class _SplitFollower:
    """Observer that attaches the recorder to comms split from a followed one."""

    def __init__(self, recorder: FlightRecorder, parent: Any) -> None:
        self._recorder = recorder
        self._parent_name = _safe_name(parent)

    def on_new_comm(self, child: Any) -> None:
        self._recorder.attach(child, parent=self._parent_name)


def _safe_name(comm: Any) -> str | None:
    try:
        return str(comm.get_name())
    except Exception:  # noqa: BLE001
        return None


def _view(e: tuple[Any, ...], thread_names: dict[int, str]) -> EntryView:
    rec, record_id, track, coll_seq, p2p_seq, frames, tid = e
    info: CommInfo = track.info
    name = _opt(rec, "name")
    op = getattr(name, "value", None) or str(name)
    timeout = _opt(rec, "timeout_s")
    reduce_op = _opt(rec, "reduce_op")
    if reduce_op is not None and not isinstance(reduce_op, str):
        t = getattr(reduce_op, "type", None)
        reduce_op = (getattr(t, "name", None) or str(reduce_op)).lower() if t is not None else str(reduce_op)
    in_engine = bool(_opt(rec, "in_engine", False))
    state, outcome = fr_format.entry_state(str(_opt(rec, "state", "scheduled")), in_engine)
    return EntryView(
        record_id=record_id,
        comm=info,
        op=op,
        seq=int(_opt(rec, "seq", coll_seq) or 0),
        collective_seq_id=coll_seq,
        p2p_seq_id=p2p_seq,
        op_id=int(_opt(rec, "op_id", record_id) or 0),
        is_p2p=bool(_opt(rec, "is_p2p", False)),
        peer=_opt(rec, "peer"),
        root=_opt(rec, "root"),
        reduce_op=reduce_op,
        input_sizes=_sizes(_opt(rec, "input_sizes")),
        input_dtypes=[_dtype_name(d) for d in (_opt(rec, "input_dtypes") or [])],
        output_sizes=_sizes(_opt(rec, "output_sizes")),
        output_dtypes=[_dtype_name(d) for d in (_opt(rec, "output_dtypes") or [])],
        timeout_s=float(timeout) if timeout is not None else None,
        time_created_ns=int(_opt(rec, "time_created_ns") or 0),
        time_started_ns=_opt(rec, "time_started_ns"),
        time_completed_ns=_opt(rec, "time_completed_ns"),
        state=state,
        error=_opt(rec, "error"),
        thread_name=thread_names.get(tid, f"thread-{tid}"),
        thread_id=tid,
        frames=[{"name": co.co_name, "filename": co.co_filename, "line": ln} for co, ln in frames],
        device_duration_ms=_opt(rec, "device_duration_ms"),
        outcome=outcome,
        in_engine=in_engine,
    )


def _env_int(var: str, default: int) -> int:
    """The declared integer ``var`` (see ``torchcomms.config``); ``default`` when unset."""
    raw = os.environ.get(var)
    return default if raw is None or raw.strip() == "" else int(config.var(var).parse(raw))


_PROCESS_RECORDER: FlightRecorder | None = None
_PROCESS_LOCK = threading.Lock()


def process_recorder() -> FlightRecorder:
    """The process-wide recorder (the registry every non-isolated hook shares), created on
    first use with ``TORCHCOMM_FR_MAX_ENTRIES`` entries (default 2048)."""
    global _PROCESS_RECORDER
    with _PROCESS_LOCK:
        if _PROCESS_RECORDER is None:
            _PROCESS_RECORDER = FlightRecorder(_env_int(MAX_ENTRIES_ENV, DEFAULT_MAX_ENTRIES))
        return _PROCESS_RECORDER


def iter_recorders() -> Iterable[FlightRecorder]:
    if _PROCESS_RECORDER is not None:
        yield _PROCESS_RECORDER
