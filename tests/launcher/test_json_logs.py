"""``--json-logs``: every line the agent writes is a JSON record, its control server's own
warnings included."""

from __future__ import annotations

import json
import signal
import subprocess

import zmq
from zmq.utils.monitor import recv_monitor_message

from conftest import REPO, base_env, free_port, launcher_cmd, read_pids, worker
from torchcomms.control.secrets import derive_keys, parse_secret


def _refused_client(address: str, server_public: bytes) -> None:
    """Connect with the job's server key but a client key of our own: the server's
    authenticator refuses it (and logs a warning); returns once the handshake failed."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    public, secret = zmq.curve_keypair()
    sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server_public
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    try:
        sock.connect(address)
        assert monitor.poll(30_000), "the server neither accepted nor refused the handshake"
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()
        ctx.term()


def test_json_logs_stay_json_when_the_control_server_warns(tmp_path, secret_file):
    port = free_port()
    env = base_env(PID_DIR=str(tmp_path / "pids"))
    (tmp_path / "pids").mkdir()
    agent = subprocess.Popen(
        launcher_cmd("--json-logs", "--nproc-per-node", "1", "--nnodes", "1", "--rdzv-id", "jl",
                     "--rdzv-endpoint", f"127.0.0.1:{port}", "--job-secret-file", str(secret_file),
                     "--grace-period", "2", worker("sleeper.py")),
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        read_pids(tmp_path / "pids", 1)
        keys = derive_keys(parse_secret(secret_file.read_text()))
        _refused_client(f"tcp://127.0.0.1:{port}", keys.server_public)
        agent.send_signal(signal.SIGTERM)
        out, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
    records = []
    for line in (out + err).splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}\n{err}") from None
    assert any("refused a client" in r.get("message", "") for r in records), err
