"""Two agents on one machine (loopback): authentication and rendezvous timeouts."""

from __future__ import annotations

import re
import secrets
import signal
import socket
import subprocess
import time

from conftest import REPO, base_env, communicate_all, free_port, launcher_cmd, read_pids, run_launcher, worker


def test_wrong_secret_is_refused_clearly(tmp_path, secret_file):
    port = free_port()
    other = tmp_path / "other.secret"
    other.write_text(secrets.token_hex(32))
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{port}",
              "--rdzv-id", "authjob", "--rdzv-conf", "join_timeout=60"]
    host = subprocess.Popen(launcher_cmd(*common, "--node-rank", "0", "--job-secret-file",
                                         str(secret_file), worker("ticker.py")),
                            env=base_env(), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        proc = run_launcher(*common, "--node-rank", "1", "--job-secret-file", str(other),
                            worker("ticker.py"), timeout=60)
        assert proc.returncode == 1
        assert f"the rendezvous host at tcp://127.0.0.1:{port} refused this agent's job secret" \
            in proc.stderr
        assert f"--job-secret-file {other}" in proc.stderr
    finally:
        host.kill()
        host.wait(timeout=10)


def test_rendezvous_timeout_names_endpoint_joined_and_missing(secret_file):
    port = free_port()
    proc = run_launcher("--nnodes", "3", "--nproc-per-node", "1", "--rdzv-endpoint",
                        f"127.0.0.1:{port}", "--rdzv-id", "lonely", "--node-rank", "0",
                        "--job-secret-file", str(secret_file), "--rdzv-conf",
                        "join_timeout=1", worker("ticker.py"), timeout=60)
    assert proc.returncode == 1
    host = socket.gethostname()
    assert (f"rendezvous at 127.0.0.1:{port} timed out after 1 s: 1 node(s) joined ({host}); "
            "2 more needed") in proc.stderr


def test_joiner_without_host_times_out_naming_endpoint(secret_file):
    port = free_port()
    proc = run_launcher("--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
                        "nohost", "--node-rank", "1", "--job-secret-file", str(secret_file),
                        "--rdzv-conf", "join_timeout=1", worker("ticker.py"), timeout=60)
    assert proc.returncode == 1
    assert f"rendezvous host at tcp://127.0.0.1:{port} did not answer within 1 s" in proc.stderr


def test_multinode_needs_a_shared_secret():
    proc = run_launcher("--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "x",
                        worker("ticker.py"))
    assert proc.returncode == 2
    assert "needs the same secret on every node: pass --job-secret-file" in proc.stderr


def test_two_agents_on_loopback(tmp_path, secret_file):
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
              "--rdzv-id", "loop", "--job-secret-file", str(secret_file)]
    env = base_env(DURATION="0")
    a = subprocess.Popen(launcher_cmd(*common, worker("ticker.py")), env=env, cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    b = subprocess.Popen(launcher_cmd(*common, worker("ticker.py")), env=env, cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outs = communicate_all((a, b), timeout=120)
    assert (a.returncode, b.returncode) == (0, 0), outs
    text = outs[0][0] + outs[1][0]
    for rank in range(4):
        assert f"rank {rank} of 4 up" in text
    assert sum("finished with exit code 0" in o[1] for o in outs) == 2


def _pair(secret_file, *extra, env):
    port = free_port()
    common = ["--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
              "--rdzv-id", "pair", "--job-secret-file", str(secret_file)]
    return [subprocess.Popen(launcher_cmd(*common, "--node-rank", str(i), *extra), env=env,
                             cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(2)]  # extra ends with the script (and its arguments)


def test_restart_across_nodes(secret_file):
    a, b = _pair(secret_file, "--nnodes", "2", "--max-restarts", "1",
                 worker("restart_once.py"), env=base_env())
    (out_a, err_a), (out_b, err_b) = communicate_all((a, b), timeout=120)
    assert (a.returncode, b.returncode) == (0, 0), err_a + err_b
    assert "rank 1 failed; restarting all workers (restart 1 of 1)" in err_a
    for rank in range(4):  # every rank of both nodes ran a second attempt
        assert f"rank {rank} attempt 1" in out_a + out_b
    assert "round 1: 2 node(s), world size 4" in err_b


def test_elastic_restart_after_node_lost(secret_file, tmp_path):
    env = base_env(PID_DIR=str(tmp_path), SLEEP="3")
    a, b = _pair(secret_file, "--nnodes", "1:2", "--max-restarts", "1", "--rdzv-conf",
                 "heartbeat_interval=0.2,heartbeat_timeout=1.5,last_call_timeout=1",
                 worker("sleeper.py"), env=env)
    try:
        read_pids(tmp_path, 4)
        for p in tmp_path.glob("*.pid"):
            p.unlink()
        b.kill()  # node 1's agent dies; its workers die with it
        b.wait(timeout=10)
        out_a, err_a = a.communicate(timeout=120)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
    # node 0 restarted alone after the last call, with world size 2, and finished cleanly
    assert a.returncode == 0, err_a
    assert "node 1 lost; restarting all workers (restart 1 of 1)" in err_a
    assert "round 1: 1 node(s), world size 2" in err_a
    assert sorted(int(p.stem) for p in tmp_path.glob("*.pid")) == [0, 1]


def test_a_signal_to_a_follower_agent_is_a_failure_of_its_ranks_for_the_job(secret_file, tmp_path):
    """A follower agent that receives SIGTERM stops its workers and leaves: its ranks failed for
    the rest of the job, which hears of it at once (``rank_failed``): under ``fail`` the host stops
    its own workers too. The host used to hear nothing and wait for its workers' own end."""
    env = base_env(PID_DIR=str(tmp_path), SLEEP="600")
    a, b = _pair(secret_file, "--nnodes", "2", worker("sleeper.py"), env=env)
    try:
        read_pids(tmp_path, 4)
        b.send_signal(signal.SIGTERM)
        (_, err_a), (_, err_b) = communicate_all((a, b), timeout=60)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
    assert b.returncode == 128 + signal.SIGTERM, err_b
    # ranks 2 and 3 both end with their agent: the host names whichever it heard of first
    assert re.search(r"rank [23] on \S+ failed \(SIGTERM\)", err_a) and "stopping the job" in err_a, err_a
    assert a.returncode == 128 + signal.SIGTERM, err_a


def test_a_signal_to_the_host_during_the_rendezvous_ends_its_followers_with_its_code(secret_file):
    """A host interrupted while it waits for nodes tells the followers already joined: they end
    with its exit code and one line saying why, instead of 'lost the rendezvous host' (exit 1)."""
    from torchcomms.control.client import ControlClient
    from torchcomms.control.secrets import read_secret_file

    port = free_port()
    common = ["--nnodes", "3", "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{port}",
              "--rdzv-id", "stopjoin", "--job-secret-file", str(secret_file)]
    agents = [subprocess.Popen(launcher_cmd(*common, "--node-rank", str(i), worker("ticker.py")), env=base_env(),
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        client = ControlClient(f"tcp://127.0.0.1:{port}", read_secret_file(secret_file), timeout=30)
        try:  # the host is up once this connects; then wait for the follower's join
            while client.add("torchcomms-run/rdzv/0/count", 0) < 2:
                time.sleep(0.02)
        finally:
            client.close()
        agents[0].send_signal(signal.SIGTERM)
        (_, err_host), (_, err) = communicate_all(agents, timeout=60)
    finally:
        for p in agents:
            if p.poll() is None:
                p.kill()
    assert agents[0].returncode == 128 + signal.SIGTERM, err_host
    assert "error: the rendezvous host received SIGTERM: the job stops" in err, err
    assert "lost the rendezvous host" not in err, err
    assert agents[1].returncode == 128 + signal.SIGTERM, err


def test_an_endpoint_that_is_no_agent_is_not_called_a_wrong_secret(secret_file):
    """A program on the rendezvous port that accepts connections and closes them (another service,
    a firewall's reset) was reported as the host refusing this agent's job secret."""
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    port = server.getsockname()[1]

    def close_each() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=close_each, daemon=True).start()
    try:
        proc = run_launcher("--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", f"127.0.0.1:{port}",
                            "--rdzv-id", "noagent", "--job-secret-file", str(secret_file), "--rdzv-conf",
                            "join_timeout=30", worker("ticker.py"), timeout=60)
    finally:
        server.close()
    assert proc.returncode == 1, proc.stderr
    assert "job secret" not in proc.stderr, proc.stderr
    assert f"error: the rendezvous endpoint tcp://127.0.0.1:{port} is no torchcomms-run agent: it closed" \
        in proc.stderr, proc.stderr
