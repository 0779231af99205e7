import json
import subprocess
import sys

import pytest

from launcher.env import JobEndpoints, WorkerPlacement, worker_env
from launcher.errors import read_error_file, record, write_error_file
from launcher.summary import job_exit_code, render_root_cause, render_table, root_cause
from launcher.supervisor import WorkerResult

TORCHRUN_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                 "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE",
                 "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}

JOB = JobEndpoints(run_id="job1", master_addr="10.0.0.1", master_port=1234,
                   control_addr="tcp://10.0.0.1:29400", secret_file="/s", restart_count=2,
                   max_restarts=3)


def test_worker_env_matches_torchrun():
    p = WorkerPlacement(rank=5, local_rank=1, world_size=8, local_world_size=4, node_rank=1,
                        num_nodes=2, role="trainer")
    env = worker_env({"PATH": "/bin", "TORCHCOMM_CONTROL_SECRET": "ab" * 32}, p, JOB,
                     error_file="/e.json")
    assert TORCHRUN_VARS <= env.keys()
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == \
        ("5", "1", "8", "4")
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["ROLE_NAME"]) == ("1", "2", "trainer")
    assert (env["ROLE_RANK"], env["ROLE_WORLD_SIZE"]) == ("5", "8")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "1234")
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("2", "3")
    assert (env["TORCHCOMM_RANK"], env["TORCHCOMM_SIZE"], env["TORCHCOMM_RUN_ID"]) == \
        ("5", "8", "job1")
    assert env["TORCHCOMM_CONTROL_ADDR"] == "tcp://10.0.0.1:29400"
    assert env["TORCHCOMM_CONTROL_SECRET_FILE"] == "/s"
    assert "TORCHCOMM_CONTROL_SECRET" not in env  # the secret travels in a 0600 file only
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["PATH"] == "/bin"


def test_omp_threads_kept_or_unset_for_one_worker():
    p1 = WorkerPlacement(0, 0, 1, 1, 0, 1)
    assert "OMP_NUM_THREADS" not in worker_env({}, p1, JOB, error_file="e")
    p4 = WorkerPlacement(0, 0, 4, 4, 0, 1)
    assert worker_env({"OMP_NUM_THREADS": "7"}, p4, JOB, error_file="e")["OMP_NUM_THREADS"] == "7"


def test_error_file_round_trip(tmp_path):
    path = tmp_path / "err.json"
    try:
        raise KeyError("missing shard")
    except KeyError as exc:
        write_error_file(path, exc)
    data = json.loads(path.read_text())
    assert data["message"]["message"] == "KeyError: 'missing shard'"
    assert "Traceback" in data["message"]["extraInfo"]["py_callstack"]
    assert int(data["message"]["extraInfo"]["timestamp"]) > 0
    err = read_error_file(path)
    assert err is not None and err.message == "KeyError: 'missing shard'"
    assert read_error_file(tmp_path / "absent.json") is None
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert read_error_file(tmp_path / "bad.json") is None


def test_record_writes_and_reraises(tmp_path):
    path = tmp_path / "e.json"
    code = ("import sys\nfrom launcher import record\n@record\ndef main():\n"
            "    raise RuntimeError('boom')\nmain()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"TORCHELASTIC_ERROR_FILE": str(path), "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": ":".join(sys.path)})
    assert proc.returncode == 1
    assert "RuntimeError: boom" in proc.stderr  # still raised
    assert read_error_file(path).message == "RuntimeError: boom"


def test_record_is_transparent(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)

    @record
    def add(a, b):
        return a + b

    assert add(2, 3) == 5
    assert add.__name__ == "add"


def _r(rank, ended, code=0, sig=None, lost=False):
    return WorkerResult(rank=rank, local_rank=rank, node_rank=0, host="h", pid=100 + rank,
                        started=0.0, ended=ended, exit_code=None if sig else code, signal=sig,
                        lost=lost)


def test_root_cause_is_first_failure():
    rs = [_r(0, 5.0, sig=15), _r(1, 2.0, code=3), _r(2, 1.0)]
    assert root_cause(rs).rank == 1
    assert job_exit_code(rs, "fail") == 3
    assert job_exit_code([_r(0, 1.0), _r(1, 1.0)], "fail") == 0
    assert job_exit_code([_r(0, 1.0, sig=9)], "fail") == 137
    assert job_exit_code([_r(0, 1.0, lost=True)], "fail") == 1


def test_shrink_rule():
    # the failure happened while others ran, and the survivors finished cleanly -> 0
    assert job_exit_code([_r(0, 9.0), _r(1, 2.0, code=4), _r(2, 9.0)], "shrink") == 0
    # a second tolerated failure is still fine
    assert job_exit_code([_r(0, 9.0), _r(1, 2.0, code=4), _r(2, 5.0, code=6)], "shrink") == 0
    # survivors failed too (the last one to exit failed) -> the root cause's code
    assert job_exit_code([_r(0, 9.0, code=7), _r(1, 2.0, code=4)], "shrink") == 4
    # a failure after everyone else had finished is not tolerated
    assert job_exit_code([_r(0, 1.0), _r(1, 3.0, code=2)], "shrink") == 2


def test_table_and_root_cause_text():
    rs = [_r(0, 5.0, sig=15), _r(1, 2.0, code=3), _r(2, 1.0, lost=True)]
    rs[2].ended = 9.0
    text = render_table(rs, title="T")
    lines = text.splitlines()
    assert lines[0] == "T"
    assert lines[1].split() == ["rank", "host", "local", "pid", "result", "duration"]
    assert "SIGTERM" in lines[3] and "exit 3  <- root cause" in lines[4]
    assert "node lost" in lines[5]
    rc = render_root_cause(rs[1])
    assert rc.startswith("root cause: rank 1 on h (exit 3)")


@pytest.mark.parametrize("lost", [False, True])
def test_result_round_trip(lost):
    r = _r(3, 4.0, code=1, lost=lost)
    assert WorkerResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r
