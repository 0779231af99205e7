"""The store a communicator rendezvous through stops answering (its host is SIGSTOPped) or is
gone (SIGKILLed): a shrink, split or reconfigure still ends by its own deadline, with a typed
error that names the store. A stopped TCPStore host blocks its clients' check/get/compare_set
for ever (the store's own timeout does not bound them); a stopped control-plane server, until
the client notices the lost connection (~6 s)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.ranks import REPO, RankGroup, free_port

WORLD = 3
TIMEOUT_S = 2.0
GRACE_S = 2.0  # the agreement's last store call, the error's making, a loaded 2-core box

_TCP_HOST = (
    "import sys, time; from datetime import timedelta; import torch.distributed as dist; "
    "s = dist.TCPStore('127.0.0.1', int(sys.argv[1]), 1, True, timeout=timedelta(seconds=120), "
    "wait_for_workers=False); print('tcp://127.0.0.1:' + sys.argv[1], flush=True); time.sleep(3600)"
)


def _start_store_host(kind: str, tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """A store host process outside the ranks, and the environment that points ranks at it."""
    if kind == "tcp":
        port = free_port()
        cmd = [sys.executable, "-c", _TCP_HOST, str(port)]
        env = {"TC_STORE_PORT": str(port)}
    else:
        secret = tmp / "secret"
        cmd = [sys.executable, "-m", "torchcomms.control", "--new-secret-file", str(secret)]
        env = {"TORCHCOMM_CONTROL_SECRET_FILE": str(secret)}
    host = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    assert host.stdout is not None
    addr = host.stdout.readline().decode().strip()
    assert addr.startswith("tcp://"), addr
    if kind == "control":
        env["TORCHCOMM_CONTROL_ADDR"] = addr
    env.update(TC_READY_DIR=str(tmp), TORCHCOMM_TRACING_DISABLE="1")
    return host, env


def _run_with_store_stopped(op: str, kind: str, sig: int = signal.SIGSTOP) -> list:
    tmp = Path(tempfile.mkdtemp(prefix="tc-store-stop-"))
    host, env = _start_store_host(kind, tmp)
    try:
        with RankGroup(WORLD, "tests.recovery.workers:op_with_store_host_stopped",
                       {"op": op, "store_kind": kind, "timeout_s": TIMEOUT_S}, env=env) as g:
            deadline = time.monotonic() + 120
            while len(list(tmp.glob("ready*"))) < WORLD:
                assert time.monotonic() < deadline, "ranks never got ready"
                dead = [r for r, p in enumerate(g.procs) if p.poll() is not None]
                assert not dead, f"rank {dead} died early:\n" + "\n".join(
                    (g.dir / f"rank{r}.log").read_text(errors="replace")[-3000:] for r in dead)
                time.sleep(0.05)
            os.kill(host.pid, sig)
            (tmp / "go").touch()
            return g.wait(timeout=TIMEOUT_S + 20, failed_grace=5)
    finally:
        host.kill()  # SIGKILL ends a stopped process too
        host.wait(10)


@pytest.mark.parametrize("kind", ["tcp", "control"])
def test_shrink_ends_by_its_deadline_when_the_store_host_is_stopped(kind: str) -> None:
    """shrink(timeout=2 s) used to block in the agreement's store calls: for ever on a TCPStore
    (until its host resumes), ~6 s on the control plane and then an untyped store error."""
    for res in _run_with_store_stopped("shrink", kind):
        v = res.value
        assert v is not None, res.stderr[-3000:]
        assert v["is_comm_error"] and v["op"] == "shrink" and v["comm"] == "stalled-store", v
        if kind == "control" and v["raised"] == "CommAbortedError":  # the monitor saw the loss first
            assert "control plane" in v["message"], v
        else:
            assert v["raised"] == "CommTimeoutError", v
            assert "store" in v["message"] and "did not answer" in v["message"], v
        assert v["elapsed"] <= TIMEOUT_S + GRACE_S, v


@pytest.mark.parametrize("kind", ["tcp", "control"])
def test_shrink_raises_a_typed_error_when_the_store_host_is_gone(kind: str) -> None:
    """A killed store host: the agreement's store call fails at once, and used to surface as the
    store's own error (DistNetworkError, ControlStoreUnavailableError), not a CommError."""
    for res in _run_with_store_stopped("shrink", kind, signal.SIGKILL):
        v = res.value
        assert v is not None, res.stderr[-3000:]
        assert v["raised"] == "CommAbortedError" and v["is_comm_error"], v
        assert v["op"] == "shrink" and v["comm"] == "stalled-store", v
        # the control plane: named as lost when the failure monitor saw that first, else as the store
        names = ["TCPStore at 127.0.0.1:"] if kind == "tcp" else ["control plane at tcp://", "control-plane store at tcp://"]
        assert any(n in v["message"] for n in names), v
        assert v["elapsed"] <= TIMEOUT_S + GRACE_S, v


@pytest.mark.parametrize("op", ["split", "reconfigure"])
def test_split_and_reconfigure_end_by_their_deadline_when_the_store_host_is_stopped(op: str) -> None:
    """Their store calls are the new engine's rendezvous, made on a thread that is waited for
    only until the op's deadline: bounded before the shrink's fix too; kept so that they stay so."""
    for res in _run_with_store_stopped(op, "tcp"):
        v = res.value
        assert v is not None, res.stderr[-3000:]
        assert v["raised"] == "CommTimeoutError" and v["is_comm_error"], v
        assert v["op"] == op and v["comm"] == "stalled-store", v
        assert v["elapsed"] <= TIMEOUT_S + GRACE_S, v
        if op == "split":  # the store may be why the new engine was not made: the error says so
            assert "or the TCPStore at 127.0.0.1:" in v["message"] and "did not answer" in v["message"], v
