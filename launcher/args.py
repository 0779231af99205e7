"""Command-line parsing: torchrun's flags in both spellings, plus torchcomms-run's own.

:func:`parse_args` returns a validated :class:`LaunchConfig`; every bad input raises
:class:`~launcher.exceptions.UsageError` with a message naming what was wrong (an unknown
flag names the closest known one).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence

from torchcomms.config import ConfigError, var

from .exceptions import UsageError
from .launch_config import (
    DEFAULT_RDZV_PORT,
    FAILURE_POLICIES,
    RDZV_BACKENDS,
    START_METHODS,
    LaunchConfig,
    RendezvousConf,
)
from .module_lookup import find_missing
from .parser import build_parser, check_unknown_flags
from .scheduler_env import detect_scheduler, mpi_rank_layout, mpi_rendezvous_port

__all__ = ["LaunchConfig", "RendezvousConf", "build_parser", "check_entrypoint", "parse_args", "parse_std_spec"]


def _int(value: str, flag: str, minimum: int | None = None) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{flag} must be an integer, got {value!r}") from None
    if minimum is not None and n < minimum:
        raise UsageError(f"{flag} must be >= {minimum}, got {n}")
    return n


def _float(value: str, flag: str, minimum: float = 0.0) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{flag} must be a number, got {value!r}") from None
    if not x > minimum and not (minimum == 0.0 and x == 0.0):
        raise UsageError(f"{flag} must be > {minimum:g}, got {value}")
    return x


def _positive(value: str, flag: str) -> float:
    """A number > 0 (a poll interval of 0 would make a wait return at once: a busy loop)."""
    x = _float(value, flag)
    if not x > 0:
        raise UsageError(f"{flag} must be > 0, got {value}")
    return x


def _fork_server(flag: bool, no_python: bool, environ: Mapping[str, str]) -> bool:
    """``--fork-server``, else ``TORCHCOMM_FORK_SERVER``; a ``--no-python`` job's executables start
    as they are (the variable is then ignored, the flag refused)."""
    if flag and no_python:
        raise UsageError("--fork-server forks Python workers; a --no-python entry point is an executable")
    try:
        wanted = flag or bool(var("TORCHCOMM_FORK_SERVER").parse(environ.get("TORCHCOMM_FORK_SERVER")))
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return wanted and not no_python


def check_entrypoint(cfg: LaunchConfig, environ: Mapping[str, str] | None = None) -> None:
    """The entry point must be there before any worker starts: each worker would otherwise fail
    on its own, with Python's ``can't open file`` or ``No module named``. A script must exist; a
    module of ``-m`` must be found by the workers' interpreter with their working directory and
    ``PYTHONPATH`` (from ``environ``), without running any of it: a submodule is refused only
    where its packages cannot change their path (see :mod:`launcher.module_lookup`).
    ``--no-python`` is checked when its workers start."""
    if cfg.no_python:
        return
    if cfg.module:
        missing = find_missing(cfg.entrypoint, os.getcwd(), os.environ if environ is None else environ)
        if missing is not None:
            raise UsageError(f"-m {cfg.entrypoint}: no module named {missing.name!r} ({missing.detail})")
        return
    if os.path.exists(cfg.entrypoint):
        return
    where = "" if os.path.isabs(cfg.entrypoint) else f" (in {os.getcwd()})"
    raise UsageError(f"the entry point {cfg.entrypoint!r} does not exist{where}")


def _nnodes(value: str) -> tuple[int, int]:
    if ":" in value:
        lo, _, hi = value.partition(":")
        mn, mx = _int(lo, "--nnodes MIN", 1), _int(hi, "--nnodes MAX", 1)
        if mn > mx:
            raise UsageError(f"--nnodes {value}: MIN ({mn}) is larger than MAX ({mx})")
        return mn, mx
    n = _int(value, "--nnodes", 1)
    return n, n


def count_gpus(environ: Mapping[str, str]) -> int:
    """Count visible NVIDIA GPUs without importing torch."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
            return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            return 0
    return 0


def _nproc(value: str, environ: Mapping[str, str]) -> int:
    if value == "cpu":
        return os.cpu_count() or 1
    if value in ("gpu", "auto"):
        gpus = count_gpus(environ)
        if gpus:
            return gpus
        if value == "gpu":
            raise UsageError("--nproc-per-node gpu: no GPU is visible on this node")
        return os.cpu_count() or 1
    return _int(value, "--nproc-per-node", 1)


def _check_local_rank(rank: int, flag: str, nproc: int) -> int:
    """``rank`` if this node has that local rank; a flag naming one it lacks would silently
    apply to no worker."""
    if rank >= nproc:
        raise UsageError(f"{flag}: this node has no local rank {rank} with --nproc-per-node "
                         f"{nproc} (local ranks 0-{nproc - 1})")
    return rank


def parse_std_spec(value: str, flag: str, nproc: int) -> dict[int, int]:
    """Parse torchrun's ``--redirects``/``--tee`` value into {local_rank: 0-3}."""
    value = value.strip()
    if value.isdigit():
        mode = int(value)
        if mode > 3:
            raise UsageError(f"{flag} must be 0-3 (1 stdout, 2 stderr, 3 both), got {value}")
        return {lr: mode for lr in range(nproc)}
    out = {lr: 0 for lr in range(nproc)}
    for item in filter(None, (s.strip() for s in value.split(","))):
        lr, sep, mode = item.partition(":")
        if not sep:
            raise UsageError(f"{flag}: expected LOCAL_RANK:MODE, got {item!r}")
        r, m = _check_local_rank(_int(lr, flag, 0), flag, nproc), _int(mode, flag, 0)
        if m > 3:
            raise UsageError(f"{flag}: mode must be 0-3, got {m} for local rank {r}")
        out[r] = m
    return out


def _rdzv_conf(value: str) -> RendezvousConf:
    fields: dict[str, object] = {}
    aliases = {"timeout": "join_timeout", "join_timeout": "join_timeout",
               "last_call_timeout": "last_call_timeout",
               "heartbeat_interval": "heartbeat_interval",
               "heartbeat_timeout": "heartbeat_timeout", "is_host": "is_host",
               "close_timeout": None, "read_timeout": None, "keep_alive_interval": None,
               "keep_alive_max_attempt": None, "use_libuv": None}
    for item in filter(None, (s.strip() for s in value.split(","))):
        key, sep, val = item.partition("=")
        if not sep:
            raise UsageError(f"--rdzv-conf: expected KEY=VALUE, got {item!r}")
        key = key.strip()
        if key not in aliases:
            close = difflib.get_close_matches(key, list(aliases), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise UsageError(f"--rdzv-conf: unknown key {key!r}{hint}")
        target = aliases[key]
        if target is None:
            continue  # torchrun's c10d-store tuning knobs have no meaning here
        if target == "is_host":
            low = val.strip().lower()
            if low not in ("1", "0", "true", "false", "yes", "no"):
                raise UsageError(f"--rdzv-conf is_host must be true or false, got {val!r}")
            fields[target] = low in ("1", "true", "yes")
        else:
            fields[target] = _float(val, f"--rdzv-conf {key}")
    return RendezvousConf(**fields)  # type: ignore[arg-type]


def _signals(value: str) -> tuple[int, ...]:
    out = []
    for name in filter(None, (s.strip() for s in value.split(","))):
        sig = getattr(signal, name if name.startswith("SIG") else f"SIG{name}", None)
        if not isinstance(sig, signal.Signals) or sig in (signal.SIGKILL, signal.SIGSTOP):
            raise UsageError(f"--signals-to-handle: {name!r} is not a signal that can be handled")
        out.append(int(sig))
    return tuple(out)


def _split_endpoint(value: str, default_port: int) -> tuple[str, int]:
    value = value.strip()
    if value.startswith("["):  # [v6]:port
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
    else:
        host, port = value, ""
    if not host:
        raise UsageError(f"--rdzv-endpoint {value!r} has no host")
    return host, (_int(port, "--rdzv-endpoint port", 0) if port else default_port)


def _check_mpi_flags(ns: argparse.Namespace) -> None:
    """``--backend mpi``: flags that cannot apply to one launcher per MPI rank are refused."""
    if ns.nproc_per_node not in (None, "1"):
        raise UsageError("--backend mpi runs one worker per launcher (each is one MPI rank): drop "
                         "--nproc-per-node and start N ranks with mpiexec -n N")
    for flag, value in (("--nnodes", ns.nnodes), ("--node-rank", ns.node_rank)):
        if value is not None:
            raise UsageError(f"--backend mpi takes {flag} from mpiexec (the MPI world's size and rank): drop it")
    if ns.standalone:
        raise UsageError("--backend mpi and --standalone cannot be combined")
    if ns.on_failure == "restart" or ns.max_restarts not in (None, "0"):
        raise UsageError("--backend mpi cannot restart workers (a restarted process cannot rejoin a running "
                         "MPI job): use --on-failure fail, or shrink (launch with mpiexec --with-ft ulfm)")
    ns.rdzv_backend = "static"  # node rank = MPI rank


def parse_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> LaunchConfig:
    """Parse and validate a command line (``argv`` without the program name)."""
    environ = os.environ if environ is None else environ
    parser = build_parser()
    check_unknown_flags(parser, argv)
    ns = parser.parse_args(list(argv))
    if ns.entrypoint_args and ns.entrypoint_args[0] == "--":
        ns.entrypoint_args = ns.entrypoint_args[1:]

    if ns.backend not in (None, "mpi"):
        raise UsageError(f"--backend {ns.backend!r}: the only launcher backend is mpi (gloo and nccl need none)")
    if ns.backend == "mpi":
        _check_mpi_flags(ns)
        sched = mpi_rank_layout(environ)
    else:
        sched = None if ns.standalone else detect_scheduler(environ)
    if ns.nnodes is not None:
        min_nodes, max_nodes = _nnodes(ns.nnodes)
    elif sched is not None and sched.nnodes is not None:
        min_nodes = max_nodes = sched.nnodes
    else:
        min_nodes = max_nodes = 1
    nproc = _nproc(ns.nproc_per_node or "1", environ)
    node_rank = _int(ns.node_rank, "--node-rank", 0) if ns.node_rank is not None else None
    if node_rank is None and sched is not None and ns.nnodes is None:
        node_rank = sched.node_rank
    if node_rank is not None and node_rank >= max_nodes:
        raise UsageError(f"--node-rank {node_rank} is out of range for --nnodes {ns.nnodes or max_nodes}")
    if ns.rdzv_backend not in RDZV_BACKENDS:
        raise UsageError(
            f"--rdzv-backend {ns.rdzv_backend!r} is not supported; use one of "
            f"{', '.join(RDZV_BACKENDS)} (the agent hosts its own store)"
        )
    if ns.rdzv_backend == "static" and max_nodes > 1:
        if min_nodes != max_nodes:
            raise UsageError(f"--rdzv-backend static needs a fixed --nnodes N, got "
                             f"{min_nodes}:{max_nodes}; use --rdzv-backend c10d for an "
                             f"elastic range")
        if node_rank is None:
            raise UsageError("--rdzv-backend static needs --node-rank on every node of a "
                             "multi-node job; use --rdzv-backend c10d to rank nodes by arrival")

    if ns.standalone:
        if max_nodes != 1:
            raise UsageError("--standalone runs a single node; drop --nnodes or --standalone")
        rdzv_host, rdzv_port = "127.0.0.1", 0
    elif ns.rdzv_endpoint:
        rdzv_host, rdzv_port = _split_endpoint(ns.rdzv_endpoint, DEFAULT_RDZV_PORT)
    elif ns.master_addr or ns.master_port:
        rdzv_host = ns.master_addr or "127.0.0.1"
        rdzv_port = _int(ns.master_port or "29500", "--master-port", 0)
    elif sched is not None and sched.endpoint_host:
        rdzv_host, rdzv_port = sched.endpoint_host, DEFAULT_RDZV_PORT
        if ns.backend == "mpi" and sched.job_id:
            rdzv_port = mpi_rendezvous_port(sched.job_id)
    elif ns.backend == "mpi":
        raise UsageError("--backend mpi with ranks on several hosts needs --rdzv-endpoint HOST:PORT "
                         "(or MASTER_ADDR) of rank 0's host")
    elif max_nodes == 1:
        rdzv_host, rdzv_port = "127.0.0.1", 0
    else:
        raise UsageError("multi-node jobs need --rdzv-endpoint HOST:PORT (or --master-addr)")
    if rdzv_port > 65535:
        raise UsageError(f"rendezvous port {rdzv_port} is out of range")

    run_id = ns.rdzv_id if ns.rdzv_id not in (None, "none") else None
    if run_id is None and sched is not None and sched.job_id:
        run_id = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{sched.name}-{sched.job_id}")
    if run_id is None:
        if max_nodes > 1:
            raise UsageError("multi-node jobs need --rdzv-id (the same on every node)")
        run_id = os.urandom(6).hex()
    if not run_id.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise UsageError(f"--rdzv-id {run_id!r} may contain only letters, digits, '-', '_', '.'")

    max_restarts = _int(ns.max_restarts, "--max-restarts", 0)
    on_failure = ns.on_failure or ("restart" if max_restarts > 0 else "fail")
    if on_failure not in FAILURE_POLICIES:
        close = difflib.get_close_matches(on_failure, FAILURE_POLICIES, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise UsageError(f"--on-failure must be restart, shrink or fail, got {on_failure!r}{hint}")
    if on_failure == "fail" and max_restarts > 0:
        raise UsageError(f"--max-restarts {max_restarts} has no effect with --on-failure fail (which ends the job "
                         "at the first failure): use --on-failure restart or shrink, or drop --max-restarts")
    if ns.start_method not in START_METHODS:
        raise UsageError(f"--start-method must be one of {', '.join(START_METHODS)}")
    if ns.start_method != "spawn":
        raise UsageError(
            f"--start-method {ns.start_method} applies to function entry points, which "
            f"torchcomms-run does not run: every worker is a fresh process running "
            f"{ns.entrypoint!r} (what torchrun does for a script whatever --start-method "
            f"says); drop the flag or pass --start-method spawn")
    hung_timeout = _float(ns.hung_timeout, "--hung-timeout")
    stopped_timeout = _float(ns.stopped_timeout, "--stopped-timeout")
    for flag, value in (("--hung-timeout", hung_timeout), ("--stopped-timeout", stopped_timeout)):
        if not value > 0:
            raise UsageError(f"{flag} must be a positive number of seconds, got {value:g}")
    if sum((ns.module, ns.no_python)) > 1:
        raise UsageError("--module and --no-python cannot be combined")
    if ns.run_path and (ns.module or ns.no_python):
        raise UsageError("--run-path cannot be combined with --module or --no-python")

    fork_server = _fork_server(ns.fork_server, ns.no_python, environ)

    filt: frozenset[int] | None = None
    if ns.local_ranks_filter.strip():
        filt = frozenset(_check_local_rank(_int(x, "--local-ranks-filter", 0),
                                           "--local-ranks-filter", nproc)
                         for x in ns.local_ranks_filter.split(",") if x.strip())
    try:
        ns.line_prefix.format(host="h", rank=0, local_rank=0, node_rank=0, role="r")
    except (KeyError, IndexError, ValueError) as exc:
        raise UsageError(f"--line-prefix {ns.line_prefix!r} is not a valid template ({exc})") from None
    secret_file = ns.job_secret_file
    if secret_file is not None and not os.path.isfile(secret_file):
        raise UsageError(f"--job-secret-file {secret_file!r} does not exist")

    return LaunchConfig(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=nproc,
        node_rank=node_rank,
        rdzv_backend=ns.rdzv_backend,
        rdzv_host=rdzv_host,
        rdzv_port=rdzv_port,
        rdzv_id=run_id,
        rdzv_conf=_rdzv_conf(ns.rdzv_conf),
        standalone=ns.standalone,
        master_addr=ns.master_addr or rdzv_host,
        max_restarts=max_restarts,
        monitor_interval=_positive(ns.monitor_interval, "--monitor-interval"),
        log_dir=ns.log_dir,
        redirects=parse_std_spec(ns.redirects, "--redirects", nproc),
        tee=parse_std_spec(ns.tee, "--tee", nproc),
        local_ranks_filter=filt,
        role=ns.role,
        local_addr=ns.local_addr,
        module=ns.module,
        no_python=ns.no_python,
        run_path=ns.run_path,
        signals_to_handle=_signals(ns.signals_to_handle),
        start_method=ns.start_method,
        on_failure=on_failure,
        job_secret_file=secret_file,
        json_logs=ns.json_logs,
        grace_period=_float(ns.grace_period, "--grace-period"),
        line_prefix=ns.line_prefix,
        summary=not ns.no_summary,
        entrypoint=ns.entrypoint,
        entrypoint_args=tuple(ns.entrypoint_args),
        scheduler=sched,
        hung_timeout=hung_timeout,
        stopped_timeout=stopped_timeout,
        backend=ns.backend,
        fork_server=fork_server,
    )
