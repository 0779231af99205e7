"""Control-plane store latency: our ZeroMQ store vs torch's TCPStore, measured in one run.

    python3 benchmarks/control_bench.py                 # defaults: 15 rounds x 300 ops
    python3 benchmarks/control_bench.py --json out.json

Both servers run in their own process (as in a job: the launcher agent hosts ours, torchrun
hosts TCPStore); the clients are in this process. For each (op, value size), the contenders
are timed call by call, interleaved (one call of each, in a shuffled order, ``--rounds`` x
``--ops`` times), so that all see the same machine load; the table shows the median latency
of a synchronous call and the ratio against TCPStore (< 1: ours is faster). Contenders:

- ``ControlClient``  — our client, called directly (what the launcher and comms use);
- ``ControlStore``   — the same through the ``torch.distributed.Store`` subclass;
- ``TCPStore``       — torch's own store (libuv server), the anchor;
- ``zmq-echo``       — a bare pyzmq CURVE ROUTER that echoes each frame (no store logic): the
  floor that ZeroMQ + CURVE + one Python server thread set for any design like ours.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from torchcomms.control.client import ControlClient  # noqa: E402
from torchcomms.control.secrets import new_secret, write_secret_file  # noqa: E402
from torchcomms.control.store import ControlStore  # noqa: E402

TCPSTORE_SERVER = """
import sys, torch.distributed as dist
from datetime import timedelta
s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                  timeout=timedelta(seconds=60))
print(s.port, flush=True)
sys.stdin.read()
"""


ECHO_SERVER = """
import sys, zmq
from torchcomms.control.secrets import derive_keys
keys = derive_keys(bytes.fromhex(sys.argv[1]))
sock = zmq.Context().socket(zmq.ROUTER)
sock.curve_secretkey, sock.curve_publickey = keys.server_secret, keys.server_public
sock.curve_server = True
print(sock.bind_to_random_port("tcp://127.0.0.1"), flush=True)
while True:
    sock.send_multipart(sock.recv_multipart())
"""


class EchoClient:
    """Round-trips one frame of the request's size through the bare echo server."""

    def __init__(self, port: int, secret: bytes) -> None:
        import zmq

        from torchcomms.control.secrets import derive_keys
        keys = derive_keys(secret)
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.curve_secretkey = keys.client_secret
        self.sock.curve_publickey = keys.client_public
        self.sock.curve_serverkey = keys.server_public
        self.sock.linger = 0
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self._values: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self._values[key] = value
        self.sock.send(value, copy=len(value) < 65536)
        self.sock.recv(copy=False)

    def get(self, key: str) -> bytes:
        # the echo returns what it gets: send the value's size to receive it back (both ways
        # carry the value, so this over-counts get by one transfer of the value)
        value = self._values.get(key, b"")
        self.sock.send(value, copy=len(value) < 65536)
        self.sock.recv(copy=False)
        return value

    def add(self, key: str, delta: int) -> int:
        self.sock.send(b"a")
        self.sock.recv()
        return delta


def start_servers(tmp: Path) -> tuple[subprocess.Popen[str], str, bytes, subprocess.Popen[str],
                                      int, subprocess.Popen[str], int]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + \
        env.get("PYTHONPATH", "")
    secret = new_secret()
    secret_file = write_secret_file(tmp / "secret", secret)
    ours = subprocess.Popen([sys.executable, "-m", "torchcomms.control", "--host", "127.0.0.1",
                             "--port", "0", "--secret-file", str(secret_file)],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert ours.stdout is not None
    address = ours.stdout.readline().strip()
    tcp = subprocess.Popen([sys.executable, "-c", TCPSTORE_SERVER], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, env=env)
    assert tcp.stdout is not None
    port = int(tcp.stdout.readline().strip())
    echo = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, secret.hex()],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert echo.stdout is not None
    echo_port = int(echo.stdout.readline().strip())
    return ours, address, secret, tcp, port, echo, echo_port


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--ops", type=int, default=300, help="calls per round (small values)")
    parser.add_argument("--sizes", default="16,65536,1048576",
                        help="value sizes in bytes, comma-separated")
    parser.add_argument("--json", default="control_bench.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        ours_proc, address, secret, tcp_proc, port, echo_proc, echo_port = \
            start_servers(Path(tmp))
        try:
            client = ControlClient(address, secret, timeout=30)
            store = ControlStore(client, timeout=timedelta(seconds=30))
            tcp = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                                timeout=timedelta(seconds=30))
            contenders: dict[str, dict[str, Callable[..., object]]] = {
                "ControlClient": {"set": client.set, "get": client.get, "add": client.add},
                "ControlStore": {"set": store.set, "get": store.get, "add": store.add},
                "TCPStore": {"set": tcp.set, "get": tcp.get, "add": tcp.add},
            }
            echo = EchoClient(echo_port, secret)
            contenders["zmq-echo"] = {"set": echo.set, "get": echo.get, "add": echo.add}
            cases: list[tuple[str, int]] = [("add", 8)]
            for size in sizes:
                cases += [("set", size), ("get", size)]
            results = []
            for op, size in cases:
                value = os.urandom(size)
                ops = max(10, args.ops if size <= 65536 else args.ops // 10)
                samples: dict[str, list[float]] = {name: [] for name in contenders}
                for name, fns in contenders.items():  # warm up, and create the key
                    fns["set"](f"bench/{size}", value)
                    for _ in range(20):
                        call(fns, op, size, value)
                order = list(contenders)
                clock = time.perf_counter
                for _ in range(args.rounds):
                    for _ in range(ops):
                        random.shuffle(order)  # interleaved single calls: same conditions
                        for name in order:
                            fns = contenders[name]
                            start = clock()
                            call(fns, op, size, value)
                            samples[name].append(clock() - start)
                row = {"op": op, "bytes": size, "calls": args.rounds * ops}
                for name, values in samples.items():
                    values.sort()
                    row[f"{name}_us"] = statistics.median(values) * 1e6
                    row[f"{name}_p90_us"] = values[int(0.9 * (len(values) - 1))] * 1e6
                for name in ("ControlClient", "ControlStore", "zmq-echo"):
                    row[f"{name}_ratio"] = row[f"{name}_us"] / row["TCPStore_us"]
                results.append(row)
                print_row(row, header=len(results) == 1)
            client.close()
        finally:
            for proc in (ours_proc, tcp_proc, echo_proc):
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    meta = {
        "benchmark": "control_bench",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
                   f"load {os.getloadavg()[0]:.1f}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "note": "median latency of single interleaved calls; ratio = ours / TCPStore; "
                "TCPStore's set is one-way (no reply), ours is acknowledged",
    }
    Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"\n{meta['date']}  {meta['machine']}  torch {meta['torch']}  -> {args.json}")
    return 0


def call(fns: dict[str, Callable[..., object]], op: str, size: int, value: bytes) -> object:
    key = f"bench/{size}"
    if op == "set":
        return fns["set"](key, value)
    if op == "get":
        return fns["get"](key)
    return fns["add"]("bench/counter", 1)


def print_row(row: dict[str, float], header: bool) -> None:
    if header:
        print(f"{'op':<5}{'bytes':>9} | {'ControlClient us':>17}{'ControlStore us':>16}"
              f"{'TCPStore us':>13}{'zmq-echo us':>13} | {'Client/TCP':>11}{'Store/TCP':>10}"
              f"{'echo/TCP':>10}")
        print("-" * 110)
    print(f"{row['op']:<5}{int(row['bytes']):>9} | {row['ControlClient_us']:>17.1f}"
          f"{row['ControlStore_us']:>16.1f}{row['TCPStore_us']:>13.1f}{row['zmq-echo_us']:>13.1f}"
          f" | {row['ControlClient_ratio']:>10.2f}x{row['ControlStore_ratio']:>9.2f}x"
          f"{row['zmq-echo_ratio']:>9.2f}x")


if __name__ == "__main__":
    sys.exit(main())
