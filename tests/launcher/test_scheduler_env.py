import pytest

from launcher.exceptions import UsageError
from launcher.scheduler_env import detect_scheduler, expand_hostlist


def test_expand_hostlist():
    assert expand_hostlist("node[01-03,7],gpu5") == ["node01", "node02", "node03", "node7", "gpu5"]
    assert expand_hostlist("r[1-2]-n[1-2]") == ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
    assert expand_hostlist("single") == ["single"]
    with pytest.raises(UsageError, match="unbalanced"):
        expand_hostlist("node[1-2")
    with pytest.raises(UsageError, match="malformed"):
        expand_hostlist("node[a-b]")


def test_outside_schedulers():
    assert detect_scheduler({}) is None
    assert detect_scheduler({"SLURM_JOB_ID": "1"}) is None  # an allocation, not an srun step


def test_slurm_step():
    info = detect_scheduler({"SLURM_PROCID": "0", "SLURM_STEP_ID": "3", "SLURM_NTASKS": "4",
                             "SLURM_NNODES": "4", "SLURM_NODEID": "0",
                             "SLURM_STEP_NODELIST": "a[1-4]", "SLURM_JOB_ID": "9"})
    assert info is not None
    assert (info.name, info.nnodes, info.node_rank, info.endpoint_host, info.job_id) == \
        ("slurm", 4, 0, "a1", "9")


def test_slurm_several_tasks_per_node_refused():
    with pytest.raises(UsageError, match="start one torchcomms-run per node"):
        detect_scheduler({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "8",
                          "SLURM_NNODES": "2", "SLURM_NODEID": "0"})


def test_openmpi_and_pmi():
    info = detect_scheduler({"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "2",
                             "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "head"})
    assert info is not None and (info.name, info.nnodes, info.node_rank, info.endpoint_host) == \
        ("ompi", 3, 2, "head")
    with pytest.raises(UsageError, match="ppr:1:node"):
        detect_scheduler({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0",
                          "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    info = detect_scheduler({"PMI_SIZE": "2", "PMI_RANK": "1"})
    assert info is not None and (info.name, info.nnodes, info.node_rank) == ("pmi", 2, 1)
    with pytest.raises(UsageError, match="SLURM_NODEID='x' is not an integer"):
        detect_scheduler({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NODEID": "x"})
