"""A starved box must not look like a lost control plane, and a supervised rank's silence is a
suspicion (``rank_silent``/``rank_heard``), not a failure."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from torchcomms.control.client import ControlClient
from torchcomms.control.secrets import new_secret, parse_secret
from torchcomms.control.server import StoreServer

from .conftest import python_env, stop_process


def _server_process(tmp_path: Path) -> tuple[subprocess.Popen[str], str, bytes]:
    secret_file = tmp_path / "secret"
    srv = subprocess.Popen([sys.executable, "-m", "torchcomms.control", "--new-secret-file",
                            str(secret_file)], env=python_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    assert srv.stdout is not None
    addr = srv.stdout.readline().strip()
    return srv, addr, parse_secret(secret_file.read_text())


def test_a_server_that_answers_nothing_for_9s_is_slow_not_lost() -> None:
    """A server whose loop answers nothing for 9 s (busy or starved; its connections stay up)
    is not reported lost: the subscription used to call ``on_error`` after one unanswered 7 s
    poll, and every communicator of the rank aborted. Events published afterwards arrive."""
    assert _errors_after_a_server_pause(9.0, lost_after=None) == []  # the serving thread held 9 s


def _errors_after_a_server_pause(hold_s: float, lost_after: float | None) -> list[Exception]:
    """Hold a server's serving thread ``hold_s`` seconds under a subscribed client, then
    publish: the event must arrive; returns what the subscription reported as errors."""
    secret = new_secret()
    errors: list[Exception] = []
    inbox: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
    with StoreServer("127.0.0.1", 0, secret) as srv:
        c = ControlClient(srv.address, secret, timeout=10.0)
        c.subscribe(["job_stopping"], lambda t, p: inbox.put((t, p)), since=None,
                    on_error=errors.append, lost_after=lost_after)
        time.sleep(0.3)
        srv._run_in_loop(lambda: time.sleep(hold_s), hold_s + 30.0)
        c.publish("job_stopping", {"reason": "after the pause"})
        topic, payload = inbox.get(timeout=30)
        assert payload["reason"] == "after the pause"
        c.close()
    return errors


def test_a_dead_server_is_still_reported_lost(tmp_path: Path) -> None:
    srv, addr, secret = _server_process(tmp_path)
    lost = threading.Event()
    c = ControlClient(addr, secret, timeout=10.0)
    c.subscribe(None, lambda t, p: None, since=None, on_error=lambda e: lost.set(), lost_after=2.0)
    time.sleep(0.3)
    srv.kill()
    srv.wait()
    assert lost.wait(40), "the subscription never reported the dead server"
    c.close()


def test_supervised_rank_silence_is_a_suspicion_then_heard_again() -> None:
    secret = new_secret()
    with StoreServer("127.0.0.1", 0, secret, heartbeat_limit=60.0, rank_silence="suspect") as srv:
        watcher = ControlClient(srv.address, secret, timeout=10.0)
        rank = ControlClient(srv.address, secret, timeout=10.0)
        inbox: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        watcher.subscribe(["rank_failed", "rank_silent", "rank_heard"],
                          lambda t, p: inbox.put((t, p)), since=None)
        rank.heartbeat_start("rank/3", 0.05, limit=0.3, info={"host": "h", "pid": 42})
        rank._heartbeats["rank/3"].stop()  # beats stop, no deregistration
        topic, payload = inbox.get(timeout=10)
        assert topic == "rank_silent" and payload["rank"] == 3 and payload["pid"] == 42
        rank._call("heartbeat", {"member": "rank/3", "limit": 0.3}, budget=5.0)
        topic, payload = inbox.get(timeout=10)
        assert topic == "rank_heard" and payload["rank"] == 3
        assert payload["silent_s"] >= 0.3
        rank.heartbeat_forget("rank/3")
        time.sleep(0.6)
        assert inbox.empty()  # forgotten: never reported again, and never as rank_failed
        rank.close()
        watcher.close()


def test_a_silent_server_whose_process_runs_on_this_host_is_never_lost(monkeypatch) -> None:
    """On a starved node (seen: load 514 on 2 cores) the control server's loop can go unanswered
    for longer than the lost limit while its process still runs; every rank then aborted its
    communicators and the job failed. With the server's process named
    (``TORCHCOMM_CONTROL_PID``), its silence is slowness while that process runs."""
    monkeypatch.setenv("TORCHCOMM_CONTROL_PID", str(os.getpid()))  # the server lives in this process
    # held past two unanswered polls (7 s each) and the lost limit between them
    assert _errors_after_a_server_pause(16.0, lost_after=0.5) == []


def test_process_running_tells_running_from_stopped_zombie_and_gone() -> None:
    from torchcomms.control.host_process import host_running_check, process_running

    assert process_running(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        assert process_running(child.pid)
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while process_running(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not process_running(child.pid)  # stopped: it will not answer
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while process_running(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not process_running(child.pid)  # a zombie until reaped
    finally:
        child.kill()
        child.wait()
    assert not process_running(child.pid)  # gone
    assert host_running_check(None) is None
