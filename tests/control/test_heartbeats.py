"""Heartbeats: silence beyond the limit is reported on the bus; a clean stop is not."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from torchcomms.control.client import ControlClient
from torchcomms.control.errors import ControlArgumentError, ControlUnavailableError
from torchcomms.control.secrets import parse_secret
from torchcomms.control.server import StoreServer

from .conftest import python_env, spawn_python, stop_process

LIMIT = 0.6  # the server fixture's heartbeat_limit
ROOMY_LIMIT = 2.0  # roomy_server's
MARGIN = 3.0  # generous: CI machines are slow and shared


def collect(client: ControlClient, topics: list[str]) -> queue.Queue[tuple[str, dict[str, Any]]]:
    inbox: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
    client.subscribe(topics, lambda t, p: inbox.put((t, p)), since=None)
    return inbox


HEARTBEATER = """
import sys, time
from torchcomms.control.client import ControlClient
c = ControlClient(sys.argv[1], bytes.fromhex(sys.argv[2]), timeout=10)
c.heartbeat_start(sys.argv[3], 0.1, info={"host": "worker-host", "pid": 1})
c.set("hb/ready", b"1")
if sys.argv[4] == "clean":
    c.heartbeat_stop()
    c.set("hb/stopped", b"1")
time.sleep(60)
"""


@pytest.fixture
def roomy_server(secret: bytes) -> Iterator[StoreServer]:
    """A server whose heartbeat limit (``ROOMY_LIMIT``) is 20 beats: a member that beats is
    never reported, even when the loaded machine delays a beat by most of a second (a 0.72 s
    gap against the 0.6 s limit reported a live member once, three test workers on 2 cores)."""
    srv = StoreServer("127.0.0.1", 0, secret, heartbeat_limit=ROOMY_LIMIT, run_id="test-run")
    srv.start()
    yield srv
    srv.stop()


def test_killed_member_is_reported_within_the_limit(roomy_server: StoreServer, secret: bytes) -> None:
    client = ControlClient(roomy_server.address, secret, timeout=10.0)
    inbox = collect(client, ["rank_failed"])
    proc = spawn_python(HEARTBEATER, roomy_server.address, secret.hex(), "rank/5", "kill")
    try:
        client.wait(["hb/ready"], timeout=30)
        time.sleep(2 * ROOMY_LIMIT)  # alive and beating: nothing reported
        assert inbox.empty(), inbox.get()
        proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        topic, payload = inbox.get(timeout=ROOMY_LIMIT + MARGIN)
        assert time.monotonic() - killed_at < ROOMY_LIMIT + MARGIN
        assert topic == "rank_failed"
        assert payload["rank"] == 5 and payload["reason"] == "heartbeat"
        assert payload["host"] == "worker-host" and payload["member"] == "rank/5"
    finally:
        stop_process(proc)
        client.close()


def test_stopped_process_is_reported(server: StoreServer, secret: bytes,
                                     client: ControlClient) -> None:
    """SIGSTOP (a hung rank) stops heartbeats as surely as a crash."""
    inbox = collect(client, ["rank_failed"])
    proc = spawn_python(HEARTBEATER, server.address, secret.hex(), "rank/1", "kill")
    try:
        client.wait(["hb/ready"], timeout=30)
        proc.send_signal(signal.SIGSTOP)
        topic, payload = inbox.get(timeout=LIMIT + MARGIN)
        assert payload["rank"] == 1
    finally:
        proc.send_signal(signal.SIGCONT)
        stop_process(proc)


def test_clean_stop_is_not_a_failure(server: StoreServer, secret: bytes,
                                     client: ControlClient) -> None:
    inbox = collect(client, ["rank_failed"])
    proc = spawn_python(HEARTBEATER, server.address, secret.hex(), "rank/2", "clean")
    try:
        client.wait(["hb/stopped"], timeout=30)
        time.sleep(LIMIT + 0.6)
        assert inbox.empty()
    finally:
        stop_process(proc)
    assert inbox.empty()


def test_a_stop_without_deregistering_leaves_the_member_to_the_silence_check(
        server: StoreServer, secret: bytes, client: ControlClient) -> None:
    """``heartbeat_stop(deregister=False)``: the beats stop and the server, which still holds
    the member, reports its silence."""
    inbox = collect(client, ["rank_failed"])
    member = ControlClient(server.address, secret, timeout=10.0)
    try:
        member.heartbeat_start("rank/4", 0.1)
        member.heartbeat_stop("rank/4", deregister=False)
        topic, payload = inbox.get(timeout=LIMIT + MARGIN)
        assert (topic, payload["rank"], payload["reason"]) == ("rank_failed", 4, "heartbeat")
    finally:
        member.close()


def test_node_member_reports_node_lost(server: StoreServer, secret: bytes,
                                       client: ControlClient) -> None:
    inbox = collect(client, ["node_lost"])
    agent = ControlClient(server.address, secret)
    agent.heartbeat_start("node/3", 0.1, info={"host": "n3", "ranks": [6, 7]})
    agent._heartbeats["node/3"].stop()  # the agent "hangs": beats stop, no deregistration
    topic, payload = inbox.get(timeout=LIMIT + MARGIN)
    assert (payload["node_rank"], payload["ranks"], payload["host"]) == (3, [6, 7], "n3")
    assert payload["reason"] == "heartbeat"
    agent.close()


def test_per_member_limit(secret: bytes) -> None:
    """A member's own limit wins over the server's (60 s here: only 0.2 s can report it)."""
    with StoreServer("127.0.0.1", 0, secret, heartbeat_limit=60.0) as srv, \
            ControlClient(srv.address, secret) as watcher, \
            ControlClient(srv.address, secret) as other:
        inbox = collect(watcher, ["member_lost"])
        other.heartbeat_start("launcher", 0.05, limit=0.2)
        other._heartbeats["launcher"].stop()
        topic, payload = inbox.get(timeout=0.2 + MARGIN)
        assert payload["member"] == "launcher" and payload["reason"] == "heartbeat"
        assert payload["silent_s"] >= 0.2


def test_heartbeat_argument_errors(client: ControlClient) -> None:
    with pytest.raises(ControlArgumentError, match="member"):
        client.heartbeat_start("", 0.1)
    for odd in ("rank/1\n", "rank/1\x1b[2J", "rank/\u202e1"):  # forged log lines, terminal escapes
        with pytest.raises(ControlArgumentError, match="member must not contain control characters"):
            client.heartbeat_start(odd, 0.1)
        with pytest.raises(ControlArgumentError, match="member must not contain control characters"):
            client.heartbeat_forget(odd)
    with pytest.raises(ControlArgumentError, match="longer than the interval"):
        client.heartbeat_start("rank/0", 0.5, limit=0.2)
    with pytest.raises(ControlArgumentError, match="> 0"):
        client.heartbeat_start("rank/0", 0)
    client.heartbeat_start("rank/0", 0.1)
    with pytest.raises(ControlArgumentError, match="already running"):
        client.heartbeat_start("rank/0", 0.1)
    client.heartbeat_stop("rank/0")
    with pytest.raises(ControlArgumentError, match="no heartbeats"):
        client.heartbeat_stop("rank/0")


def test_deregistering_from_a_stopped_server_waits_one_interval_once_beats_fail(tmp_path: Path) -> None:
    """A server that stopped answering (SIGSTOP: hung, or its host stopped) held every rank's
    exit for the whole deregistration timeout, although the heartbeats had already gone
    unanswered; once they have, the deregistration waits one heartbeat interval."""
    secret_file = tmp_path / "secret"
    srv = subprocess.Popen([sys.executable, "-m", "torchcomms.control", "--new-secret-file", str(secret_file)],
                           env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert srv.stdout is not None
        addr = srv.stdout.readline().strip()
        c = ControlClient(addr, parse_secret(secret_file.read_text()), timeout=10.0)
        c.heartbeat_start("rank/0", 0.1)
        srv.send_signal(signal.SIGSTOP)
        beat = c._heartbeats["rank/0"]
        deadline = time.monotonic() + 30
        while not beat.failing:  # one beat's budget (1 s) after the stop
            assert time.monotonic() < deadline, "heartbeats never noticed the stopped server"
            time.sleep(0.05)
        t0 = time.monotonic()
        with pytest.raises(ControlUnavailableError):
            c.heartbeat_stop(timeout=5.0)
        took = time.monotonic() - t0
        assert took < 2.5, took  # it was the whole 5 s
        c.close()
    finally:
        srv.send_signal(signal.SIGCONT)
        stop_process(srv)
