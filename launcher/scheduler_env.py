"""Job layout from a batch scheduler's environment (Slurm, Open MPI, PMI).

When ``torchcomms-run`` is started once per node by ``srun`` or ``mpirun``, these variables
fill in the node count, this node's rank, the rendezvous host and a job id that the user did
not give on the command line.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from .exceptions import UsageError

__all__ = ["SchedulerInfo", "detect_scheduler", "expand_hostlist", "mpi_rank_layout", "mpi_rendezvous_port"]


@dataclass(frozen=True)
class SchedulerInfo:
    """What the scheduler says about this launcher's place in the job."""

    name: str
    nnodes: int | None
    node_rank: int | None
    endpoint_host: str | None
    job_id: str | None


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(f"malformed Slurm host list {text!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise UsageError(f"malformed Slurm host list {text!r}: unbalanced '['")
    parts.append("".join(cur))
    return [p for p in parts if p]


def _expand_one(pattern: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", pattern)
    if m is None:
        return [pattern]
    head, tail = pattern[: m.start()], pattern[m.end():]
    out: list[str] = []
    for item in m.group(1).split(","):
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise UsageError(f"malformed Slurm host list range {item!r} in {pattern!r}")
        width = len(lo)
        stop = int(hi) if sep else int(lo)
        for n in range(int(lo), stop + 1):
            for rest in _expand_one(tail):
                out.append(f"{head}{n:0{width}d}{rest}")
    return out


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm host list such as ``node[01-03,7],gpu-a[1-2]-ib`` into host names."""
    hosts: list[str] = []
    for part in _split_top_level(text.strip()):
        hosts.extend(_expand_one(part))
    return hosts


def _int_or_none(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"scheduler variable {key}={value!r} is not an integer") from None


def _one_per_node(name: str, local_size: int | None, how: str) -> None:
    if local_size is not None and local_size > 1:
        raise UsageError(
            f"{name} started {local_size} launchers on this node; start one torchcomms-run "
            f"per node ({how}) and let it start the workers"
        )


def detect_scheduler(env: Mapping[str, str]) -> SchedulerInfo | None:
    """Return the scheduler's view of this launcher, or ``None`` outside a scheduler step."""
    if "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        ntasks = _int_or_none(env, "SLURM_NTASKS")
        nnodes = _int_or_none(env, "SLURM_NNODES") or _int_or_none(env, "SLURM_JOB_NUM_NODES")
        if ntasks is not None and nnodes is not None and ntasks != nnodes:
            _one_per_node("srun", -(-ntasks // nnodes), "srun --ntasks-per-node=1")
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        hosts = expand_hostlist(nodelist) if nodelist else []
        return SchedulerInfo(
            name="slurm",
            nnodes=nnodes,
            node_rank=_int_or_none(env, "SLURM_NODEID"),
            endpoint_host=env.get("MASTER_ADDR") or (hosts[0] if hosts else None),
            job_id=env.get("SLURM_JOB_ID"),
        )
    if "OMPI_COMM_WORLD_SIZE" in env:
        _one_per_node("mpirun", _int_or_none(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
                      "mpirun --map-by ppr:1:node")
        return SchedulerInfo(
            name="ompi",
            nnodes=_int_or_none(env, "OMPI_COMM_WORLD_SIZE"),
            node_rank=_int_or_none(env, "OMPI_COMM_WORLD_RANK"),
            endpoint_host=env.get("MASTER_ADDR"),
            job_id=env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE"),
        )
    if "PMI_SIZE" in env and "PMI_RANK" in env:
        _one_per_node("the PMI launcher", _int_or_none(env, "MPI_LOCALNRANKS"),
                      "one process per node")
        return SchedulerInfo(
            name="pmi",
            nnodes=_int_or_none(env, "PMI_SIZE"),
            node_rank=_int_or_none(env, "PMI_RANK"),
            endpoint_host=env.get("MASTER_ADDR"),
            job_id=env.get("PMI_JOBID") or env.get("PMIX_NAMESPACE"),
        )
    return None


def mpi_rank_layout(env: Mapping[str, str]) -> SchedulerInfo:
    """``--backend mpi``: this launcher is one rank of an Open MPI job (``mpiexec -n N
    torchcomms-run --backend mpi ...``) and runs that rank's one worker, which inherits the
    rank's MPI identity. Launcher "nodes" are the MPI ranks: node rank = MPI rank; their
    rendezvous host is ``MASTER_ADDR``, else this host when every rank runs here."""
    size, rank = _int_or_none(env, "OMPI_COMM_WORLD_SIZE"), _int_or_none(env, "OMPI_COMM_WORLD_RANK")
    if size is None or rank is None:
        raise UsageError(
            "--backend mpi runs one torchcomms-run per MPI rank, started by Open MPI's mpiexec: "
            "mpiexec -n N [--with-ft ulfm] torchcomms-run --backend mpi train.py "
            "(OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE are not set)")
    local = _int_or_none(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
    return SchedulerInfo(
        name="mpi",
        nnodes=size,
        node_rank=rank,
        endpoint_host=env.get("MASTER_ADDR") or ("127.0.0.1" if local == size else None),
        job_id=env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid"),
    )


def mpi_rendezvous_port(job_id: str) -> int:
    """The rendezvous port of a ``--backend mpi`` job that names none: derived from the job id,
    so that every rank computes the same one (20000-39999)."""
    return 20000 + zlib.crc32(job_id.encode()) % 20000
