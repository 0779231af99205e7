"""A follower agent whose rendezvous host goes away between the job's decision and the ack.

Run as a script, it is ``torchcomms-run`` (the real agent, in this process) with one fault
injected at the control client (``ControlClient.set``): when the agent is about to
acknowledge a decision (a key ``.../ack/<node_rank>``), the decision has been read, and the
agent first sends ``$HOST_SIGNAL`` (``SIGKILL`` or ``SIGSTOP``) to the host agent
``$HOST_PID`` and waits until the signal took effect (the host is a zombie, gone, or
stopped); only then is the ack sent. So the host is lost exactly in the window the race
needs, with nothing timed. It prints ``[host-gone] <signal> pid <pid>`` to stderr.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None  # gone (reaped by its parent, the test)


def _signal_host(pid: int, sig: signal.Signals) -> None:
    os.kill(pid, sig)
    took = {"Z", "X", None} if sig == signal.SIGKILL else {"T"}
    deadline = time.monotonic() + 30  # a bound against hanging, never reached in practice
    while _state(pid) not in took:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{sig.name} did not take effect on pid {pid}")
        time.sleep(0.005)
    print(f"[host-gone] {sig.name} pid {pid}", file=sys.stderr, flush=True)


def main() -> int:
    from launcher.cli import main as torchcomms_run
    from torchcomms.control.client import ControlClient

    host_pid = int(os.environ["HOST_PID"])
    sig = signal.Signals[os.environ.get("HOST_SIGNAL", "SIGKILL")]
    real_set = ControlClient.set
    fired: list[bool] = []

    def set_(self: ControlClient, key: str, value: bytes) -> Any:
        if "/ack/" in key and not fired:
            fired.append(True)
            _signal_host(host_pid, sig)
        return real_set(self, key, value)

    ControlClient.set = set_  # type: ignore[method-assign]
    return torchcomms_run(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
