"""A store hosted by the test in a process of its own (a TCPStore, or the control plane's
server), which ranks started without the launcher meet on, and the environment that points
``tests.recovery`` workers at it."""
from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.ports import free_port
from tests.helpers.paths import REPO

_TCP_HOST = (
    "import sys, time; from datetime import timedelta; import torch.distributed as dist; "
    "s = dist.TCPStore('127.0.0.1', int(sys.argv[1]), 1, True, timeout=timedelta(seconds=120), "
    "wait_for_workers=False); print('tcp://127.0.0.1:' + sys.argv[1], flush=True); time.sleep(3600)"
)


def start_store_host(kind: str, tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """A store host process of ``kind`` (``"tcp"`` or ``"control"``, its job secret written to
    ``tmp/secret``), started in a session of its own and answering once this returns, and the
    environment that points ranks at it (``tmp``: their ready folder). The caller kills it."""
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
