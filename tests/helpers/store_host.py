"""A store hosted by the test in a process of its own (a TCPStore, or the control plane's
server), which ranks started without the launcher meet on, and the environment that points
``tests.recovery`` workers at it.

The TCPStore's host is a one-rank :class:`~tests.helpers.ranks.RankGroup` running
:func:`tcp_store_host`: forked from the test process's rank zygote (torch imported already)
instead of paying ``import torch`` again (~1.9 s of CPU a host)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from tests.helpers.paths import REPO
from tests.helpers.ports import free_port
from tests.helpers.rank_sync import GROUP_DIR_ENV
from tests.helpers.ranks import RankGroup

_READY_S = 120.0  # a loaded 2-core box starting the host


def tcp_store_host(port: int) -> None:
    """Rank body: host a TCPStore on ``port``, mark its group's directory ``ready`` once it
    listens, then wait to be killed."""
    import torch.distributed as dist

    _store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=120), wait_for_workers=False)
    (Path(os.environ[GROUP_DIR_ENV]) / "ready").touch()
    time.sleep(3600)


class HostProcess:
    """The store host's process: what the tests use of a ``Popen`` (``pid``, ``poll``, ``wait``,
    ``kill``)."""

    def __init__(self, group: RankGroup) -> None:
        self._group = group
        self._proc = group.procs[0]
        self.pid = group.pids[0]

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._proc.wait(timeout)

    def kill(self) -> None:
        self._group.kill_all()


def _start_tcp_host() -> tuple[HostProcess, int]:
    """The TCPStore's host, listening once this returns, and its port."""
    port = free_port()
    group = RankGroup(1, "tests.helpers.store_host:tcp_store_host", {"port": port})
    try:
        group.wait_ready(group.dir, timeout=_READY_S)
    except BaseException:
        group.kill_all()
        raise
    return HostProcess(group), port


def start_store_host(kind: str, tmp: Path) -> tuple[subprocess.Popen[bytes] | HostProcess, dict[str, str]]:
    """A store host process of ``kind`` (``"tcp"`` or ``"control"``, its job secret written to
    ``tmp/secret``), started in a session of its own and answering once this returns, and the
    environment that points ranks at it (``tmp``: their ready folder). The caller kills it."""
    host: subprocess.Popen[bytes] | HostProcess
    if kind == "tcp":
        host, port = _start_tcp_host()
        addr, env = f"tcp://127.0.0.1:{port}", {"TC_STORE_PORT": str(port)}
    else:
        secret = tmp / "secret"
        cmd = [sys.executable, "-m", "torchcomms.control", "--new-secret-file", str(secret)]
        host = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        assert host.stdout is not None
        addr = host.stdout.readline().decode().strip()
        env = {"TORCHCOMM_CONTROL_SECRET_FILE": str(secret), "TORCHCOMM_CONTROL_ADDR": addr}
    assert addr.startswith("tcp://"), addr
    env.update(TC_READY_DIR=str(tmp), TORCHCOMM_TRACING_DISABLE="1")
    return host, env


@contextmanager
def watched_tcp_store(prefix: str) -> Iterator[dict[str, str]]:
    """Host a TCPStore until the block ends; yields the ranks' environment: its port
    (``TC_STORE_PORT``), a fresh ready folder (``TC_READY_DIR``), tracing off, the store watch on."""
    host, env = start_store_host("tcp", Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        yield {**env, "TORCHCOMM_STORE_WATCH": "1"}
    finally:
        host.kill()
        host.wait(10)
