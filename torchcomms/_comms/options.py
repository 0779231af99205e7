"""``backend.options`` of a :class:`torchcomms._comms._BackendWrapper`: what c10d's own backend
for the same engine exposes.

c10d's ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` expose their options object (``_timeout``,
``group_name``, ``global_ranks_in_group``, and the engine's own fields: gloo's ``_devices`` and
``_threads``, NCCL's ``is_high_priority_stream`` and ``config``); user code and torch read it.
The wrapper's is an object of the same c10d type, built from the engine under the communicator
(not the engine's own object: the engine's timeout is a backstop and its group is not c10d's),
with ``_timeout`` the communicator's current timeout and the group's c10d name and global ranks
filled in as c10d fills them (``[]`` for the default group). Unlike c10d's, writing its
``_timeout`` does not change the group's timeout; ``distributed_c10d._set_pg_timeout`` does, on both.
"""
from __future__ import annotations

from typing import Any

from torch._C import _distributed_c10d as c10d_ext

#: engine option fields copied from the engine's own options (those its c10d type binds)
_ENGINE_FIELDS = ("_devices", "_threads", "is_high_priority_stream", "config")


def _engine(comm: Any) -> Any:
    """The c10d backend under ``comm``, or None (an engine that is none, as MPI's; a finalized
    communicator)."""
    try:
        engine = comm.get_backend_impl()
    except Exception:  # noqa: BLE001 - a finalized communicator has no engine
        return None
    return engine if isinstance(engine, c10d_ext.Backend) else None


def _fresh(comm: Any, engine: Any, name: str) -> Any:
    """A new options object of the engine's c10d options type, with the engine's own fields."""
    src = getattr(engine, "options", None) if engine is not None else None
    try:
        opts = type(src)() if src is not None else None
    except TypeError:  # a type that takes constructor arguments
        opts = None
    if opts is None:
        return c10d_ext.Backend.Options(name, comm.get_options().timeout)
    for field in _ENGINE_FIELDS:
        if hasattr(src, field):
            try:
                setattr(opts, field, getattr(src, field))
            except (AttributeError, TypeError):
                pass
    return opts


def _c10d_group(comm: Any) -> tuple[str, list[int]] | None:
    """The c10d name and global ranks (``[]`` for the default group, as c10d sets them) of the
    process group whose backend forwards to ``comm``; None when no registered group does."""
    from torch.distributed import distributed_c10d as c10d

    if not c10d.is_initialized():
        return None
    default = c10d._get_default_group()
    for pg, name in list(c10d._world.pg_names.items()):
        for dev in pg._device_types:
            get_comm = getattr(pg._get_backend(dev), "get_comm", None)
            if get_comm is not None and get_comm() is comm:
                ranks = c10d._world.pg_group_ranks.get(pg, {})
                return name, [] if pg is default else sorted(ranks, key=ranks.__getitem__)
    return None


class BackendOptions:
    """The one options object a wrapper hands out (the same object on every read, as c10d's)."""

    def __init__(self, comm: Any, backend_name: str) -> None:
        self._comm = comm
        self._name = backend_name
        self._opts: Any = None
        self._engine_id: int | None = None

    def get(self) -> Any:
        """The options object, its ``_timeout`` the communicator's now; rebuilt when the engine
        under the communicator changed (a shrink, a reconfigure), kept once it is gone."""
        engine = _engine(self._comm)
        if self._opts is None or (engine is not None and id(engine) != self._engine_id):
            self._opts, self._engine_id = _fresh(self._comm, engine, self._name), id(engine)
        group = _c10d_group(self._comm)
        if group is not None:
            self._opts.group_name, self._opts.global_ranks_in_group = group
        self._opts._timeout = self._comm.get_options().timeout
        return self._opts
