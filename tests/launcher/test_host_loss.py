"""Two agents on loopback: the rendezvous host (and with it the control plane) is stopped
(SIGSTOP) or killed, and the other agent must end within its bounds, naming the host.

The tests watch the job's own store keys (with the job secret) to stop the host at the
exact phase, so nothing here depends on sleeping "long enough".
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from conftest import REPO, base_env, free_port, launcher_cmd, wait_for, worker
from torchcomms.control.client import ControlClient
from torchcomms.control.errors import ControlError
from torchcomms.control.secrets import parse_secret


def _agent(node_rank: int, port: int, secret_file: Path, *extra: str, nnodes: str = "2",
           env: dict[str, str], script: str) -> subprocess.Popen[str]:
    argv = launcher_cmd("--nnodes", nnodes, "--nproc-per-node", "1", "--node-rank",
                        str(node_rank), "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
                        "hostloss", "--job-secret-file", str(secret_file), "--grace-period",
                        "2", *extra, worker(script))
    return subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _store_has(port: int, secret_file: Path, key: str) -> Callable[[], bool]:
    """A predicate: ``key`` is in the job's store (False while the host is not up yet)."""
    client = ControlClient(f"tcp://127.0.0.1:{port}", parse_secret(secret_file.read_text()),
                           timeout=2.0)

    def present() -> bool:
        try:
            return client.check([key])
        except ControlError:
            return False

    present.close = client.close  # type: ignore[attr-defined]
    return present


def _cleanup(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
        p.communicate(timeout=30)


def test_join_to_a_stopped_host_times_out_naming_it(secret_file):
    """A stopped host still accepts TCP connections (the kernel completes them) but never
    answers: that is a rendezvous timeout at join_timeout, not a refused secret."""
    port = free_port()
    host = _agent(0, port, secret_file, "--rdzv-conf", "join_timeout=60", script="ticker.py",
                  env=base_env())
    present = _store_has(port, secret_file, "torchcomms-run/rdzv/0/node/1")
    try:
        assert wait_for(present, 60, interval=0.01)  # the host joined its own round
        host.send_signal(signal.SIGSTOP)
        start = time.monotonic()
        follower = subprocess.run(
            launcher_cmd("--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                         f"127.0.0.1:{port}", "--rdzv-id", "hostloss", "--job-secret-file",
                         str(secret_file), "--rdzv-conf", "join_timeout=2", worker("ticker.py")),
            env=base_env(), cwd=REPO, capture_output=True, text=True, timeout=60)
        took = time.monotonic() - start
    finally:
        present.close()  # type: ignore[attr-defined]
        _cleanup(host)
    assert follower.returncode == 1, follower.stderr
    assert "refused" not in follower.stderr, follower.stderr
    assert (f"rendezvous host at tcp://127.0.0.1:{port} did not answer within 2 s: it accepts "
            "connections but never completes the handshake") in follower.stderr, follower.stderr
    assert took < 2 + 3, f"took {took:.1f} s"  # the join timeout, plus starting Python
