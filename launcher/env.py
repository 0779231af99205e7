"""The environment of each worker: torchrun's variables plus the control plane's.

torchrun's set is reproduced exactly, so scripts written for torchrun run unchanged;
``TORCHCOMM_*`` variables tell ``torchcomms.new_comm`` where the job's control plane is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["WorkerPlacement", "JobEndpoints", "node_env", "worker_env", "mpi_worker_env"]


@dataclass(frozen=True)
class WorkerPlacement:
    """Where one worker sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    role: str = "default"


@dataclass(frozen=True)
class JobEndpoints:
    """Job-wide addresses and ids handed to every worker."""

    run_id: str
    master_addr: str
    master_port: int
    control_addr: str
    secret_file: str
    restart_count: int
    max_restarts: int
    #: the agent process hosting the control plane, for the workers on its host (else None)
    control_pid: int | None = None
    #: marks the processes of this agent's workers, for its watcher (see :mod:`launcher.watcher`)
    agent_mark: str | None = None


def node_env(base: Mapping[str, str], local_world_size: int, agent_mark: str | None) -> dict[str, str]:
    """What every worker of a node has in its environment besides its own place in the job
    (:func:`worker_env` adds that): also a fork server's environment."""
    env = dict(base)
    # A secret given to the agent inline must not leak into every worker's environment:
    # workers read it from the 0600 file instead (the file wins anyway).
    env.pop("TORCHCOMM_CONTROL_SECRET", None)
    env.pop("TORCHCOMM_AGENT_MARK", None)  # an outer agent's, when this one runs in a worker
    if agent_mark is not None:
        env["TORCHCOMM_AGENT_MARK"] = agent_mark
    if "OMP_NUM_THREADS" not in base and local_world_size > 1:
        env["OMP_NUM_THREADS"] = "1"  # torchrun's rule: one thread each when sharing a node
    # Output goes through the agent's pipes; without this Python would buffer it in blocks.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def worker_env(
    base: Mapping[str, str],
    placement: WorkerPlacement,
    job: JobEndpoints,
    *,
    error_file: str,
) -> dict[str, str]:
    """Return the full environment of one worker, built on top of ``base``."""
    env = node_env(base, placement.local_world_size, job.agent_mark)
    env.update(
        {
            "RANK": str(placement.rank),
            "LOCAL_RANK": str(placement.local_rank),
            "WORLD_SIZE": str(placement.world_size),
            "LOCAL_WORLD_SIZE": str(placement.local_world_size),
            "GROUP_RANK": str(placement.node_rank),
            "GROUP_WORLD_SIZE": str(placement.num_nodes),
            "ROLE_NAME": placement.role,
            "ROLE_RANK": str(placement.rank),
            "ROLE_WORLD_SIZE": str(placement.world_size),
            "MASTER_ADDR": job.master_addr,
            "MASTER_PORT": str(job.master_port),
            "TORCHELASTIC_RUN_ID": job.run_id,
            "TORCHELASTIC_RESTART_COUNT": str(job.restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(job.max_restarts),
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCHELASTIC_ERROR_FILE": error_file,
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            "TORCHCOMM_RANK": str(placement.rank),
            "TORCHCOMM_SIZE": str(placement.world_size),
            "TORCHCOMM_RUN_ID": job.run_id,
            "TORCHCOMM_CONTROL_ADDR": job.control_addr,
            "TORCHCOMM_CONTROL_SECRET_FILE": job.secret_file,
        }
    )
    env.pop("TORCHCOMM_CONTROL_PID", None)
    if job.control_pid is not None:
        env["TORCHCOMM_CONTROL_PID"] = str(job.control_pid)
    return env


def mpi_worker_env(env: dict[str, str]) -> None:
    """``--backend mpi``: the worker is its launcher's MPI rank (it inherits the rank's Open MPI
    variables). It is not a child of Open MPI's daemon, which so never sees it die: under ULFM
    (``mpiexec --with-ft ulfm``) MPI's own heartbeat failure detector is turned on, or the
    survivors' MPI would wait for a dead worker forever (measured: ``MPI_Comm_shrink`` never
    returned without it). ``LOCAL_RANK`` is the rank's place on its host, as mpiexec placed it."""
    if env.get("OMPI_MCA_mpi_ft_enable", "").strip().lower() in ("1", "true", "yes", "on", "enabled"):
        env.setdefault("OMPI_MCA_mpi_ft_detector", "true")
    local = env.get("OMPI_COMM_WORLD_LOCAL_RANK")
    if local is not None:
        env["LOCAL_RANK"] = local
