"""A TCPStore hosted by the test in a process of its own (ranks started without the launcher
meet on it), and the environment that points ``tests.recovery`` workers at it with the store
watch on."""
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
    "wait_for_workers=False); print('up', flush=True); time.sleep(3600)"
)


@contextmanager
def watched_tcp_store(prefix: str) -> Iterator[dict[str, str]]:
    """Host a TCPStore until the block ends; yields the ranks' environment: its port
    (``TC_STORE_PORT``), a fresh ready folder (``TC_READY_DIR``), tracing off, the store watch on."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    port = free_port()
    host = subprocess.Popen([sys.executable, "-c", _TCP_HOST, str(port)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert host.stdout is not None and host.stdout.readline().strip() == b"up"
        yield {"TC_STORE_PORT": str(port), "TC_READY_DIR": str(tmp), "TORCHCOMM_TRACING_DISABLE": "1",
               "TORCHCOMM_STORE_WATCH": "1"}
    finally:
        host.kill()
        host.wait(10)
