"""Two agents on loopback: the rendezvous host (and with it the control plane) is stopped
(SIGSTOP) or killed, and the other agent must end within its bounds, naming the host:
at each phase of a job it notices within its heartbeat timeout, stops its workers and exits
1 saying what it was doing; a join to a stopped host ends at the join timeout. A follower
that already read the job's final decision exits with the job's code instead.

The tests watch the job's own store keys (with the job secret) to stop the host at the
exact phase, so nothing here depends on sleeping "long enough".
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from conftest import REPO, base_env, free_port, launcher_cmd, pid_alive, read_pids, wait_for, worker
from torchcomms.control.client import ControlClient
from torchcomms.control.errors import ControlError
from torchcomms.control.secrets import parse_secret

HB = "heartbeat_interval=0.2,heartbeat_timeout=1.5"
#: Detection (heartbeat_timeout 1.5 s, plus a monitor tick) + stopping workers that obey
#: SIGTERM + teardown. Before the follower's calls were bounded by the heartbeat timeout,
#: ZeroMQ's own 5 s heartbeat (or the 10 s request timeout) decided instead: ~5-6 s.
BOUND_S = 4.5


def _agent_args(node_rank: int, port: int, secret_file: Path, *extra: str,
                nnodes: str = "2") -> list[str]:
    return ["--nnodes", nnodes, "--nproc-per-node", "1", "--node-rank", str(node_rank),
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "hostloss",
            "--job-secret-file", str(secret_file), "--grace-period", "2", *extra]


def _agent(node_rank: int, port: int, secret_file: Path, *extra: str, nnodes: str = "2",
           env: dict[str, str], script: str) -> subprocess.Popen[str]:
    argv = launcher_cmd(*_agent_args(node_rank, port, secret_file, *extra, nnodes=nnodes),
                        worker(script))
    return subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _proc_code(pid: int) -> str | None:
    """The one-letter state of ``pid`` from /proc (``T`` stopped), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


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


#: Anything of round 1: joining it, waiting for its plan or, when the test was slow to stop
#: the host, starting, supervising or reporting on its workers.
ROUND_1 = "[a-z ]+ round 1"
# (nnodes, extra rdzv-conf, host env, follower env, script, store key to stop at (None:
#  when both workers run), what the follower says it was doing (a regular expression))
PHASES = {
    # the follower joined and waits for the plan; the host waits for a third node
    "rendezvous": ("2:3", ",last_call_timeout=60,join_timeout=60", {}, {}, "ticker.py",
                   "torchcomms-run/rdzv/0/node/2", "waiting for the plan of rendezvous round 0"),
    # both nodes' workers run
    "running": ("2", "", {"SLEEP": "60"}, {"SLEEP": "60"}, "sleeper.py", None,
                "supervising the workers of round 0"),
    # the host's rank 0 failed and the host decided to restart: the follower is reading the
    # decision, acknowledging it or (on a loaded machine) already in round 1
    "restart": ("2", "", {"FAIL_RANK": "0"}, {"FAIL_RANK": "0"}, "fails_once.py",
                "torchcomms-run/job/0/decision",
                f"(waiting for|acknowledging) the decision of round 0|{ROUND_1}"),
    # the follower acknowledged the restart: it joins round 1 (or waits for its plan)
    "rejoin": ("2", "", {"FAIL_RANK": "0"}, {"FAIL_RANK": "0"}, "fails_once.py",
               "torchcomms-run/job/0/ack/1", ROUND_1),
    # the follower's workers are done and its results published; the host's still run
    "job end": ("2", "", {"DURATION": "60"}, {"DURATION": "0"}, "ticker.py",
                "torchcomms-run/job/0/result/1", "waiting for the decision of round 0"),
}


@pytest.mark.parametrize("how", [signal.SIGSTOP, signal.SIGKILL], ids=["sigstop", "sigkill"])
@pytest.mark.parametrize("phase", list(PHASES))
def test_follower_leaves_when_the_host_goes(phase, how, secret_file, tmp_path):
    nnodes, conf, host_env, follower_env, script, key, doing = PHASES[phase]
    port = free_port()
    extra = ("--rdzv-conf", HB + conf, "--max-restarts",
             "1" if phase in ("restart", "rejoin") else "0")
    host = _agent(0, port, secret_file, *extra, nnodes=nnodes, script=script,
                  env=base_env(PID_DIR=str(tmp_path), **host_env))
    follower = _agent(1, port, secret_file, *extra, nnodes=nnodes, script=script,
                      env=base_env(PID_DIR=str(tmp_path), **follower_env))
    present = _store_has(port, secret_file, key or "unused")
    try:
        if key is None:
            pids = read_pids(tmp_path, 2)
        else:
            assert wait_for(present, 60, interval=0.01), f"{key} never appeared"
            pids = []
        host.send_signal(how)
        stopped = time.monotonic()
        _, err = follower.communicate(timeout=60)
        took = time.monotonic() - stopped
    finally:
        present.close()  # type: ignore[attr-defined]
        _cleanup(host, follower)
    print(f"{phase}, {signal.Signals(how).name}: the follower left {took:.2f} s later")
    assert follower.returncode == 1, err
    assert took < BOUND_S, f"the follower took {took:.1f} s to leave:\n{err}"
    said = rf"error: lost the rendezvous host at tcp://127\.0\.0\.1:{port} while ({doing}): "
    assert re.search(said, err), err
    assert wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=10)


def test_join_to_a_stopped_host_times_out_naming_it(secret_file):
    """A stopped host still accepts TCP connections (the kernel completes them) but never
    answers: that is a rendezvous timeout at join_timeout, not a refused secret. The time is
    taken from the follower's own "joining" line, so Python's start-up under load is not in it."""
    port = free_port()
    host = _agent(0, port, secret_file, "--rdzv-conf", "join_timeout=60", script="ticker.py",
                  env=base_env())
    present = _store_has(port, secret_file, "torchcomms-run/rdzv/0/node/1")
    try:
        assert wait_for(present, 60, interval=0.01)  # the host joined its own round
        host.send_signal(signal.SIGSTOP)
        follower = subprocess.Popen(
            launcher_cmd("--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                         f"127.0.0.1:{port}", "--rdzv-id", "hostloss", "--job-secret-file",
                         str(secret_file), "--rdzv-conf", "join_timeout=2", worker("ticker.py")),
            env=base_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines = _stamped_lines(follower.stderr)
        returncode = follower.wait(timeout=60)
        ended = time.monotonic()
        lines.join(timeout=10)
        stderr = "".join(line for _, line in lines.stamped)
        joining = [t for t, line in lines.stamped if "joining the rendezvous host at" in line]
        assert joining, stderr
        took = ended - joining[0]
        print(f"join to a stopped host: the follower left {took:.2f} s after announcing its join")
    finally:
        present.close()  # type: ignore[attr-defined]
        _cleanup(host)
    assert returncode == 1, stderr
    assert "refused" not in stderr, stderr
    assert (f"rendezvous host at tcp://127.0.0.1:{port} did not answer within 2 s: it accepts "
            "connections but never completes the handshake") in stderr, stderr
    # the join timeout, then raising, printing the error and ending Python
    assert took < 2 + 3.0, f"took {took:.1f} s after the join was announced\n{stderr}"


class _StampedLines(threading.Thread):
    """Reads a pipe line by line, keeping each line with the monotonic time it arrived."""

    def __init__(self, pipe: IO[str]) -> None:
        super().__init__(daemon=True)
        self.pipe = pipe
        self.stamped: list[tuple[float, str]] = []

    def run(self) -> None:
        for line in self.pipe:
            self.stamped.append((time.monotonic(), line))


def _stamped_lines(pipe: IO[str] | None) -> _StampedLines:
    assert pipe is not None
    reader = _StampedLines(pipe)
    reader.start()
    return reader


ACK_RACE = str(Path(__file__).with_name("host_gone_before_ack.py"))


@pytest.mark.parametrize("how", [signal.SIGSTOP, signal.SIGKILL], ids=["sigstop", "sigkill"])
def test_follower_that_read_the_decision_exits_with_the_jobs_code(how, secret_file):
    """The host goes after the follower read the job's final decision (exit 3: the host's
    rank exits 3) and before its ack landed (``host_gone_before_ack.py`` stops or kills the
    host right before the ack is sent): the job's end is known, so the follower exits 3,
    warning that the host was lost after the decision, instead of failing the job with 1."""
    port = free_port()
    extra = ("--rdzv-conf", HB, "--max-restarts", "0")
    host = _agent(0, port, secret_file, *extra, script="fails_once.py",
                  env=base_env(FAIL_RANK="0", FAIL_AFTER="0"))
    argv = [sys.executable, ACK_RACE, *_agent_args(1, port, secret_file, *extra),
            worker("fails_once.py")]
    follower = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=base_env(FAIL_RANK="0", HOST_PID=str(host.pid),
                                                        HOST_SIGNAL=how.name))
    gone = (lambda: host.poll() is not None) if how == signal.SIGKILL else \
        (lambda: _proc_code(host.pid) == "T")
    try:
        assert wait_for(gone, 60, interval=0.01), "the follower never reached its ack"
        stopped = time.monotonic()
        _, err = follower.communicate(timeout=60)
        took = time.monotonic() - stopped
    finally:
        _cleanup(host, follower)
    print(f"host {how.name} before the final ack: the follower exited {took:.2f} s later")
    assert f"[host-gone] {how.name} pid {host.pid}" in err, err
    assert follower.returncode == 3, err
    assert took < BOUND_S, f"the follower took {took:.1f} s to leave:\n{err}"
    assert re.search(rf"warning: lost the rendezvous host at tcp://127\.0\.0\.1:{port} after "
                     r"the job's decision \(exit code 3\)", err), err
    assert "error:" not in err, err
