"""Shared fixtures: a running control server with a fresh job secret, and clients of it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchcomms.control.client import ControlClient
from torchcomms.control.protocol import Limits
from torchcomms.control.secrets import new_secret
from torchcomms.control.server import StoreServer

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def secret() -> bytes:
    return new_secret()


@pytest.fixture
def server(secret: bytes) -> Iterator[StoreServer]:
    srv = StoreServer("127.0.0.1", 0, secret, heartbeat_limit=0.6, run_id="test-run")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def small_server(secret: bytes) -> Iterator[StoreServer]:
    """A server with tiny limits, so that oversized messages are cheap to build."""
    srv = StoreServer("127.0.0.1", 0, secret, limits=Limits(
        max_key_bytes=64, max_value_bytes=1024, max_keys_per_request=16,
        max_payload_bytes=1024, message_overhead_bytes=1024))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: StoreServer, secret: bytes) -> Iterator[ControlClient]:
    c = ControlClient(server.address, secret, timeout=10.0)
    yield c
    c.close()


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def spawn_python(code: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    """Start ``python -c code args...`` with the repository importable."""
    return subprocess.Popen([sys.executable, "-c", code, *args], env=python_env(),
                            text=True, **kwargs)  # type: ignore[call-overload]


def stop_process(proc: subprocess.Popen[str]) -> None:
    """Kill ``proc`` if it still runs and reap it (no process is ever left behind)."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
