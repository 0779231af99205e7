"""Discovery of rank, world size, local device and the rendezvous store."""
from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any

import torch

from torchcomms.config import settings
from torchcomms.core.errors import CommTypeError, CommValueError
from torchcomms.core.store_calls import PendingCall, innermost_store

# (method, rank variable, size variable), in API.md's discovery order; torchcomms' own pair
# (TORCHCOMM_RANK/SIZE) comes first, from torchcomms.config.
_RANK_SIZE_SOURCES: list[tuple[str, str, str]] = [
    ("mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("mpi", "PMI_RANK", "PMI_SIZE"),
    ("torchrun", "RANK", "WORLD_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS"),
]


def _int_env(env: dict[str, str], var: str) -> int:
    raw = env[var]
    try:
        return int(raw)
    except ValueError:
        raise CommValueError(f"environment variable {var}={raw!r} is not an integer") from None


def discover_rank_size(env: dict[str, str] | None = None) -> tuple[int, int, str]:
    """(rank, size, source variable) from the environment; (0, 1, 'default') when none is set.

    ``TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD`` (auto|torchrun|mpi|slurm|torchcomm) forces a source.
    """
    cfg = settings(env)
    env = dict(os.environ) if env is None else env
    method = cfg.rank_size_method
    if method in ("auto", "torchcomm") and (cfg.rank is not None or cfg.size is not None):
        if cfg.rank is None or cfg.size is None:
            have, missing = ("TORCHCOMM_RANK", "TORCHCOMM_SIZE") if cfg.size is None else ("TORCHCOMM_SIZE", "TORCHCOMM_RANK")
            raise CommValueError(f"{have} is set but {missing} is not")
        if not cfg.rank < cfg.size:
            raise CommValueError(f"TORCHCOMM_RANK={cfg.rank} / TORCHCOMM_SIZE={cfg.size} is not a valid rank/size pair")
        return cfg.rank, cfg.size, "TORCHCOMM_RANK"
    for src, rvar, svar in _RANK_SIZE_SOURCES:
        if method != "auto" and src != method:
            continue
        if rvar in env and svar in env:
            rank, size = _int_env(env, rvar), _int_env(env, svar)
            if size < 1 or not 0 <= rank < size:
                raise CommValueError(f"{rvar}={rank} / {svar}={size} is not a valid rank/size pair")
            return rank, size, rvar
        if (rvar in env) != (svar in env):
            missing = svar if rvar in env else rvar
            raise CommValueError(f"{rvar if rvar in env else svar} is set but {missing} is not")
    if method != "auto":
        raise CommValueError(f"bootstrap method {method!r} forced, but its rank/size variables are not set")
    return 0, 1, "default"


#: c10d's function that makes a process group's backends, and the module it lives in
_C10D_HELPER = ("_new_process_group_helper", "torch.distributed.distributed_c10d")


def c10d_helper_call(max_depth: int = 8) -> dict[str, Any] | None:
    """The local variables of c10d's ``_new_process_group_helper`` when it is among the
    ``max_depth`` callers of the caller (``new_comm`` called by c10d for a process group,
    ``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1``), else ``None``. c10d passes only a name and a store
    to ``new_comm``; the helper's own arguments say the rest (:func:`c10d_group_being_made`,
    :func:`c10d_group_timeout`)."""
    import inspect

    frame = inspect.currentframe()
    for _ in range(max_depth + 1):
        frame = frame.f_back if frame is not None else None
        if frame is None:
            return None
        if (frame.f_code.co_name, frame.f_globals.get("__name__")) == _C10D_HELPER:
            return frame.f_locals
    return None


def c10d_group_being_made(helper: dict[str, Any]) -> tuple[int, int, tuple[int, ...]] | None:
    """(group rank, group size, global ranks) of the group c10d's helper call ``helper``
    (:func:`c10d_helper_call`) makes, else ``None`` (the environment's then). On torch 2.11, whose
    ``new_group`` makes subgroups that way (2.13 splits the default group instead), the rank and
    size from the environment are the job's, and a subgroup's members waited in its rendezvous
    for ranks outside it. The default group (no ranks listed) has the rank and world size c10d's
    rendezvous gave it: ``init_process_group(rank=, world_size=)`` with an ``init_method`` or a
    ``store`` (``mp.spawn``'s programs) sets no environment variable, and every process made a
    communicator of rank 0 and size 1 (every collective a no-op)."""
    ranks = helper.get("global_ranks_in_group")
    rank, size = helper.get("group_rank"), helper.get("group_size")
    if not isinstance(rank, int) or not isinstance(size, int) or not 0 <= rank < size:
        return None
    if not ranks:
        return rank, size, tuple(range(size))
    if len(ranks) != size:
        return None
    return rank, size, tuple(int(g) for g in ranks)


def c10d_device_comm_name(helper: dict[str, Any], name: str, device: Any) -> str:
    """The name of the communicator c10d's helper call ``helper`` makes for the device type it is
    at (its loop's ``device``, else ``device``): the group's name, with ``:<device type>`` appended
    where the group's devices use different backends (``init_process_group("cpu:gloo,cuda:nccl")``).
    c10d then makes one communicator per backend under the same group name, and the second was
    refused ("a communicator named '0' already exists in this process")."""
    try:
        backends = {str(b) for b in helper["backend_config"].get_device_backend_map().values()}
    except (KeyError, AttributeError):
        return name
    return f"{name}:{torch.device(helper.get('device', device)).type}" if len(backends) > 1 else name


def c10d_unranked_default_group(helper: dict[str, Any]) -> bool:
    """Whether c10d's helper call ``helper`` makes a default group of rank -1 and size -1: c10d
    does so for the backend name ``"mpi"``, whose own ``ProcessGroupMPI`` would give them, and
    keeps them when the torchcomms route makes the backend instead, so ``get_rank()`` is -1 and
    every ``new_group`` leaves the rank out (its ops return ``None`` and change nothing)."""
    return (not helper.get("global_ranks_in_group") and helper.get("group_rank") == -1
            and helper.get("group_size") == -1)


def c10d_default_timeout(timeout: timedelta) -> bool:
    """Whether ``timeout`` is one of c10d's defaults (``init_process_group``, ``new_group`` and
    ``split_group`` put one in place of a timeout not given): those leave a communicator's
    own default (``TORCHCOMM_TIMEOUT_SECONDS``) in place."""
    from torch.distributed import constants

    return timeout in (constants.default_pg_timeout, constants.default_pg_nccl_timeout)


def c10d_group_timeout(helper: dict[str, Any]) -> timedelta | None:
    """The timeout given to ``init_process_group`` (or to a subgroup c10d makes through its
    process-group helper), from the helper call ``helper`` (:func:`c10d_helper_call`): c10d
    passes no timeout to ``new_comm``. ``None`` for c10d's default (:func:`c10d_default_timeout`)."""
    timeout = helper.get("timeout")
    if not isinstance(timeout, timedelta) or timeout.total_seconds() <= 0 or c10d_default_timeout(timeout):
        return None
    return timeout


def local_rank(env: dict[str, str] | None = None) -> int:
    env = dict(os.environ) if env is None else env
    for var in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"):
        if var in env:
            return _int_env(env, var)
    return 0


def resolve_device(device: Any) -> torch.device:
    """A ``torch.device``; ``cuda`` without an index becomes ``LOCAL_RANK``'s device."""
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as e:
            raise CommValueError(f"invalid device {device!r}: {e}") from None
    if not isinstance(device, torch.device):
        raise CommTypeError(f"device must be a torch.device or str, got {type(device).__name__}")
    if device.type != "cpu" and device.index is None:
        n = torch.cuda.device_count() if device.type == "cuda" else 1
        idx = local_rank() % max(n, 1)
        device = torch.device(device.type, idx)
    return device


class _StoreRegistry:
    """One TCPStore per (host, port) per process: several communicators share it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: dict[tuple[str, int], Any] = {}
        self._connecting: dict[tuple[str, int], PendingCall[Any]] = {}
        self._control: dict[str, Any] = {}

    def tcp(self, host: str, port: int, rank: int, size: int, timeout: timedelta, until: float,
            hosted: bool = True) -> Any:
        """The TCPStore at ``host:port`` (rank 0 hosts it where ``hosted``; else every rank is a
        client), made once; waited for until ``until`` (``time.monotonic()``): its constructor
        blocks for as long as the host is stopped, so it runs on a thread of its own, and a caller
        that gives up gets ``StoreNotAnswering`` while the store is still made (and kept) if the
        host answers later."""
        import torch.distributed as dist

        key = (host, port)
        with self._lock:
            store = self._stores.get(key) or _c10d_default_store(host, port)
            if store is not None:
                self._stores[key] = store
                return store
            pending = self._connecting.get(key)
            if pending is None:
                pending = self._connecting[key] = PendingCall(
                    lambda: dist.TCPStore(host, port, size, hosted and rank == 0, timeout=timeout,
                                           wait_for_workers=False),
                    on_end=lambda call: self._connected(key, call),
                ).start(f"torchcomms-tcpstore-{host}:{port}")
        return pending.wait("the connection to it", until)

    def _connected(self, key: tuple[str, int], call: PendingCall[Any]) -> None:
        with self._lock:
            self._connecting.pop(key, None)
            if call.error is None:
                self._stores[key] = call.result

    def control(self, addr: str, secret: bytes, timeout: timedelta) -> Any:
        with self._lock:
            store = self._control.get(addr)
            if store is None:
                from torchcomms.control.store import ControlStore

                store = ControlStore.connect(addr, secret, timeout=timeout)  # no I/O until first used
                self._control[addr] = store
            return store


STORES = _StoreRegistry()


def _c10d_default_store(host: str, port: int) -> Any:
    """The TCPStore that c10d's default group of this process met on, when it is the one at
    ``host:port`` (``init_process_group`` through MASTER_ADDR/MASTER_PORT): rank 0 hosts it
    already, so a store of our own could not listen there; ``None`` otherwise."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
    except (ValueError, RuntimeError, KeyError, AttributeError):  # a private helper: whatever it may raise
        return None
    inner = innermost_store(store)
    if isinstance(inner, dist.TCPStore) and inner.port == port and inner.host == host:
        return inner
    return None


def control_plane_address(env: dict[str, str] | None = None) -> str | None:
    return settings(env).control_addr


def control_plane_secret(env: dict[str, str] | None = None) -> bytes:
    """The job secret (``TORCHCOMM_CONTROL_SECRET_FILE`` or ``TORCHCOMM_CONTROL_SECRET``), read
    by the control plane's own reader; a missing or malformed one is a ``CommValueError``."""
    from torchcomms.control.errors import ControlAuthError
    from torchcomms.control.secrets import load_secret

    try:
        secret = load_secret(os.environ if env is None else env)
    except ControlAuthError as e:
        raise CommValueError(f"TORCHCOMM_CONTROL_ADDR is set but the job secret is unusable: {e}") from None
    assert secret is not None
    return secret


def describe_default_store(env: dict[str, str] | None = None) -> str:
    """The store :func:`resolve_store` picks when none is given, in words (for error messages)."""
    env = dict(os.environ) if env is None else env
    addr = control_plane_address(env)
    if addr:
        return f"the control-plane store at {addr}"
    return f"the TCPStore at {env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"


def resolve_store(store: Any, rank: int, size: int, timeout: timedelta,
                  until: float | None = None) -> tuple[Any, str]:
    """(store, kind): the given store; else the control plane's; else the TCPStore at
    MASTER_ADDR:MASTER_PORT (hosted by rank 0, torchrun's agent, or c10d's default group of this
    process), connected to by ``until`` (``time.monotonic()``; default: ``timeout`` from now) or
    ``StoreNotAnswering``."""
    if store is not None:
        return store, "given"
    addr = control_plane_address()
    if addr:
        return STORES.control(addr, control_plane_secret(), timeout), "control"
    if size == 1 and "MASTER_ADDR" not in os.environ:
        import torch.distributed as dist

        return dist.HashStore(), "local"
    host = os.environ.get("MASTER_ADDR")
    port_raw = os.environ.get("MASTER_PORT")
    if not host or not port_raw:
        raise CommValueError(
            f"no store for a world of size {size}: pass store=, run under torchcomms-run, "
            "or set MASTER_ADDR and MASTER_PORT"
        )
    try:
        port = int(port_raw)
    except ValueError:
        raise CommValueError(f"MASTER_PORT={port_raw!r} is not an integer") from None
    if until is None:
        until = time.monotonic() + timeout.total_seconds()
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = STORES.tcp(host, port, rank, size, timeout, until, hosted=not agent)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        return store, "tcp"
    import torch.distributed as dist

    # torchrun's agent hosts the store and keeps it across restarts: each attempt's keys apart,
    # or a restarted rank would read the last attempt's engine addresses (as c10d's env://)
    return dist.PrefixStore(f"torchcomms/attempt_{attempt}", store), "tcp"
