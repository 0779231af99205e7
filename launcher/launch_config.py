"""What a launch is: :class:`LaunchConfig`, the validated result of ``torchcomms-run``'s
command line (built by :func:`launcher.args.parse_args`), and the flags' choices and defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from .scheduler_env import SchedulerInfo

__all__ = ["LaunchConfig", "RendezvousConf", "FAILURE_POLICIES", "RDZV_BACKENDS", "START_METHODS",
           "DEFAULT_HUNG_TIMEOUT_S", "DEFAULT_STOPPED_TIMEOUT_S", "DEFAULT_RDZV_PORT"]

FAILURE_POLICIES = ("restart", "shrink", "fail")
RDZV_BACKENDS = ("static", "c10d", "torchcomms")
START_METHODS = ("spawn", "fork", "forkserver")
#: Seconds of heartbeat silence without CPU progress before a rank is hung (--hung-timeout).
DEFAULT_HUNG_TIMEOUT_S = 30.0
#: Seconds a rank may stay stopped (SIGSTOP) before it is reported (--stopped-timeout).
DEFAULT_STOPPED_TIMEOUT_S = 2.0
DEFAULT_RDZV_PORT = 29400


@dataclass(frozen=True)
class RendezvousConf:
    """``--rdzv-conf`` settings, in seconds."""

    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    heartbeat_interval: float = 0.5
    heartbeat_timeout: float = 3.0
    is_host: bool | None = None


@dataclass(frozen=True)
class LaunchConfig:
    """Everything the agent needs to run a job, validated."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    node_rank: int | None
    rdzv_backend: str
    rdzv_host: str
    rdzv_port: int
    rdzv_id: str
    rdzv_conf: RendezvousConf
    standalone: bool
    master_addr: str
    max_restarts: int
    monitor_interval: float
    log_dir: str | None
    redirects: dict[int, int]
    tee: dict[int, int]
    local_ranks_filter: frozenset[int] | None
    role: str
    local_addr: str | None
    module: bool
    no_python: bool
    run_path: bool
    signals_to_handle: tuple[int, ...]
    start_method: str
    on_failure: str
    job_secret_file: str | None
    json_logs: bool
    grace_period: float
    line_prefix: str
    summary: bool
    entrypoint: str
    entrypoint_args: tuple[str, ...]
    scheduler: SchedulerInfo | None = field(default=None)
    backend: str | None = None  # "mpi": one launcher per MPI rank (see --backend)
    hung_timeout: float = DEFAULT_HUNG_TIMEOUT_S
    stopped_timeout: float = DEFAULT_STOPPED_TIMEOUT_S
    fork_server: bool = False  # workers forked from one process that imported torch (--fork-server)

    @property
    def rdzv_endpoint(self) -> str:
        return f"{self.rdzv_host}:{self.rdzv_port}"

    @property
    def is_multinode(self) -> bool:
        return self.max_nodes > 1

    def worker_entry(self) -> tuple[str, str, tuple[str, ...]] | None:
        """What :meth:`worker_argv` runs, as a fork server runs it: (``path``, ``module`` or
        ``run_path``, the script or module, its arguments); None for ``--no-python``."""
        if self.no_python:
            return None
        mode = "module" if self.module else "run_path" if self.run_path else "path"
        return mode, self.entrypoint, self.entrypoint_args

    def worker_argv(self, python: str) -> list[str]:
        """The command line each worker process runs."""
        if self.no_python:
            return [self.entrypoint, *self.entrypoint_args]
        if self.module:
            return [python, "-m", self.entrypoint, *self.entrypoint_args]
        if self.run_path:
            runner = ("import runpy, sys; sys.argv = sys.argv[1:]; "
                      "runpy.run_path(sys.argv[0], run_name='__main__')")
            return [python, "-c", runner, self.entrypoint, *self.entrypoint_args]
        return [python, self.entrypoint, *self.entrypoint_args]
