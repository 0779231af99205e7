"""The control plane at cluster size: N simulated ranks against our control server and, in the
same run, against c10d's TCPStore (libuv server), doing the same work.

    python3 benchmarks/scale_bench.py --ranks 256,1024,4096
    python3 benchmarks/scale_bench.py --ranks 256 --json /tmp/scale.json

Each simulated rank is a thread with a connection of its own (a CURVE-authenticated DEALER
socket speaking the control plane's real msgpack protocol, or a ``TCPStore`` client); the ranks
are spread over ``--procs`` worker processes. Both servers run in processes of their own, whose
CPU time (``/proc/<pid>/stat``) and resident memory (``/proc/<pid>/status``) are read around
every phase. Phases, each timed from the command to the last rank done:

- ``connect``: every rank connects (and, for ours, completes the CURVE handshake);
- ``rendezvous``: every rank sets its address under ``addr/<rank>`` and reads everyone's
  (``multi_get`` of all N keys);
- ``barrier``: ``add`` to a counter, the last arrival sets ``done``, everybody waits for it;
- ``fanout``: every rank waits for one ``rank_failed`` event (ours: a parked ``events``
  request; TCPStore: a blocking ``get`` of the event's key); timed from the publish to the
  last rank that received it. With ``--fanout-clients poll`` (the default) one thread per
  worker process receives its ranks' replies by polling their sockets, so the simulated
  clients do not cost the shared cores one thread wake-up per rank (on a real cluster each
  rank wakes on its own core); ``threads`` keeps a blocked thread per rank;
- ``agree``: a shrink agreement among the N-1 survivors, rank N-1 known failed. ``--agree
  library`` (the default) calls ``torchcomms.recovery.agreement.agree_on_survivors`` itself
  on each rank's store (TCPStore: its ``TCPStore`` client; ours: the rank's raw client behind
  the ``Store`` methods the agreement calls, the requests ``ControlStore`` makes). Two
  patterns replayed by hand are kept for comparison: ``--agree scan`` (the library's polling
  before its arrival counter: ``<p>/in/<rank>`` check-ins, each survivor polling every other
  survivor's key with ``check``, then ``compare_set`` of ``<p>/decision``) and ``--agree
  count`` (the same keys plus an arrival counter; the survivor that completes it reads all
  check-ins in one ``check``, the others block on the decision);
- ``heartbeat``: every rank beats every ``--hb-interval`` s for ``--hb-seconds`` (ours: the
  ``heartbeat`` op; TCPStore: a ``set`` of ``hb/<rank>``); reports the server's CPU share and
  its CPU time per beat.

The clients share the machine's cores with the servers: phase times include the client side.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TCPSTORE_SERVER = """
import sys, torch.distributed as dist
from datetime import timedelta
s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                  timeout=timedelta(seconds=600), use_libuv=True)
print(s.port, flush=True)
sys.stdin.read()
"""

PHASES = ("connect", "rendezvous", "barrier", "fanout", "agree", "heartbeat")


# ----------------------------------------------------------------------------- clients

class RawControl:
    """One simulated rank's connection to our server: a CURVE DEALER socket speaking the
    control plane's msgpack request/reply protocol (no pool, no monitor: one rank, one socket)."""

    def __init__(self, ctx: Any, address: str, keys: Any) -> None:
        import zmq

        from torchcomms.control.auth import configure_client_socket
        self._zmq = zmq
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.setsockopt(zmq.RCVTIMEO, 600_000)
        configure_client_socket(self.sock, keys)
        self.sock.connect(address)
        self._ids = itertools.count(1)

    def send(self, op: str, **fields: Any) -> int:
        """Send one request; returns its id (the reply carries it)."""
        import msgpack
        request_id = next(self._ids)
        self.sock.send(msgpack.packb({"id": request_id, "op": op, **fields}, use_bin_type=True))
        return request_id

    def reply(self, request_id: int) -> dict[str, Any] | None:
        """The next message on the socket if it answers ``request_id`` (else ``None``: stale)."""
        import msgpack
        reply = msgpack.unpackb(self.sock.recv(), raw=False)
        return reply if reply.get("id") == request_id else None

    def call(self, op: str, **fields: Any) -> Any:
        request_id = self.send(op, **fields)
        while (reply := self.reply(request_id)) is None:
            pass
        return self.value(op, reply, fields)

    def value(self, op: str, reply: dict[str, Any], fields: dict[str, Any]) -> Any:
        """A reply's value, or the error ``ControlStore`` would raise for it."""
        if not reply["ok"]:
            if isinstance(reply["error"], dict) and reply["error"].get("code") == "timeout":
                from torchcomms.control.store import ControlStoreTimeoutError  # what ControlStore raises
                raise ControlStoreTimeoutError(f"{op}: {reply['error']}", fields.get("keys", []))
            raise RuntimeError(f"{op}: {reply['error']}")
        return reply["value"]

    def connect(self) -> None:
        self.call("ping")

    def set(self, key: str, value: bytes) -> None:
        self.call("set", key=key, value=value)

    def get(self, key: str) -> bytes:
        return self.call("get", key=key, timeout=600.0)

    def add(self, key: str, delta: int) -> int:
        return self.call("add", key=key, delta=delta)

    def check(self, keys: list[str]) -> bool:
        return self.call("check", keys=keys)

    def wait(self, keys: list[str], timeout: float = 600.0) -> None:
        self.call("wait", keys=keys, timeout=timeout)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self.call("multi_get", keys=keys, timeout=600.0)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self.call("compare_set", key=key, expected=expected, desired=desired)

    def append(self, key: str, value: bytes) -> None:
        self.call("append", key=key, value=value)

    def wait_event(self, since: int) -> None:
        while not self.call("events", **_event_request(since)):
            pass

    def beat(self, rank: int, interval: float) -> float:
        """One beat; returns the interval the server asks for."""
        reply = self.call("heartbeat", member=f"rank/{rank}", interval=interval, limit=600.0)
        return float(reply["interval"]) if isinstance(reply, dict) else interval


class RawControlStore:
    """A rank's :class:`RawControl` behind the ``Store`` methods that
    ``torchcomms.recovery.agreement`` calls, with ``ControlStore``'s signatures and errors (a
    wait that times out raises ``ControlStoreTimeoutError``, a ``DistStoreError``)."""

    def __init__(self, raw: RawControl) -> None:
        self.raw = raw

    def set(self, key: str, value: bytes) -> None:
        self.raw.set(key, bytes(value))

    def get(self, key: str) -> bytes:
        return self.raw.get(key)

    def add(self, key: str, delta: int) -> int:
        return self.raw.add(key, delta)

    def append(self, key: str, value: bytes) -> None:
        self.raw.append(key, bytes(value))

    def check(self, keys: list[str]) -> bool:
        return self.raw.check(list(keys))

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        self.raw.wait(list(keys), timeout.total_seconds())

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self.raw.compare_set(key, bytes(expected), bytes(desired))

    def delete_key(self, key: str) -> bool:
        return self.raw.call("delete", key=key)

    def has_extended_api(self) -> bool:
        return True


class TcpStoreRank:
    """One simulated rank's TCPStore client."""

    def __init__(self, port: int) -> None:
        import torch.distributed as dist
        self.store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                                   timeout=timedelta(seconds=600), use_libuv=True)

    def connect(self) -> None:
        self.store.check(["connect"])

    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, value)

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def add(self, key: str, delta: int) -> int:
        return self.store.add(key, delta)

    def check(self, keys: list[str]) -> bool:
        return self.store.check(keys)

    def wait(self, keys: list[str], timeout: float = 600.0) -> None:
        self.store.wait(keys, timedelta(seconds=timeout))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self.store.multi_get(keys)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self.store.compare_set(key, expected, desired)

    def wait_event(self, since: int) -> None:
        self.store.get("event/rank_failed")

    def beat(self, rank: int, interval: float) -> float:
        self.store.set(f"hb/{rank}", str(time.time()).encode())
        return interval


# ----------------------------------------------------------------------------- rank work

def rendezvous(store: Any, rank: int, n: int) -> None:
    store.set(f"addr/{rank}", f"10.{rank >> 16 & 255}.{rank >> 8 & 255}.{rank & 255}:29500".encode())
    values = store.multi_get([f"addr/{r}" for r in range(n)])
    assert len(values) == n


def barrier(store: Any, rank: int, n: int) -> None:
    if store.add("barrier/count", 1) == n:
        store.set("barrier/done", b"1")
    store.wait(["barrier/done"])


def agree_scan(store: Any, rank: int, n: int, deadline: float) -> list[int]:
    """The survivor agreement's store calls (torchcomms.recovery.agreement.agree_on_survivors:
    check in, poll the decision and every expected survivor's check-in, compare_set the
    proposal), rank ``n - 1`` known failed."""
    prefix, failed = "shrink/1", {n - 1}
    store.set(f"{prefix}/in/{rank}", b"1")
    decision = f"{prefix}/decision"
    arrived: set[int] = set()
    while True:
        if store.check([decision]):
            return json.loads(store.get(decision))
        expected = [r for r in range(n) if r not in failed]
        for r in expected:
            if r not in arrived and store.check([f"{prefix}/in/{r}"]):
                arrived.add(r)
        if all(r in arrived for r in expected) or time.monotonic() >= deadline:
            proposal = json.dumps(sorted(arrived - failed)).encode()
            stored = store.compare_set(decision, b"", proposal)
            return json.loads(stored or proposal)
        time.sleep(0.002)


def agree_count(store: Any, rank: int, n: int, deadline: float) -> list[int]:
    """The same keys plus an arrival counter: the survivor whose check-in completes the count
    confirms every check-in with one multi-key ``check`` and proposes; the others block on the
    decision key (with a slice, to notice a failure or the deadline)."""
    prefix, failed = "shrink/1", {n - 1}
    expected = [r for r in range(n) if r not in failed]
    store.set(f"{prefix}/in/{rank}", b"1")
    decision = f"{prefix}/decision"
    count = store.add(f"{prefix}/arrived", 1)
    if count >= len(expected) and store.check([f"{prefix}/in/{r}" for r in expected]):
        proposal = json.dumps(expected).encode()
        stored = store.compare_set(decision, b"", proposal)
        return json.loads(stored or proposal)
    while True:
        try:
            store.wait([decision], timeout=max(0.05, min(1.0, deadline - time.monotonic())))
            return json.loads(store.get(decision))
        except Exception:  # noqa: BLE001 - a wait slice ran out
            if time.monotonic() >= deadline:
                return agree_scan(store, rank, n, deadline)


def agree_library(store: Any, rank: int, n: int, deadline: float) -> list[int]:
    """``agree_on_survivors`` itself on this rank's store, rank ``n - 1`` known failed."""
    from torchcomms.recovery.agreement import agree_on_survivors
    survivors = agree_on_survivors(store, "shrink/1", rank, list(range(n)), lambda: {n - 1}, deadline)
    if survivors != list(range(n - 1)):
        raise RuntimeError(f"rank {rank} agreed on {len(survivors)} survivors, not {n - 1}")
    return survivors


def _event_request(since: int) -> dict[str, Any]:
    return {"since": since, "topics": ["rank_failed"], "timeout": 600.0}


def _fanout_poll(raws: list[RawControl], since: int) -> tuple[float, list[str]]:
    """Every rank's parked ``events`` request, all received by one thread polling every socket:
    the simulated ranks cost the shared cores one wake-up per batch of replies instead of one
    thread wake-up (and GIL hand-off) per rank. Returns the last rank's receipt time."""
    import zmq

    poller = zmq.Poller()
    pending: dict[Any, tuple[RawControl, int]] = {}
    for raw in raws:
        pending[raw.sock] = (raw, raw.send("events", **_event_request(since)))
        poller.register(raw.sock, zmq.POLLIN)
    end, errors = 0.0, []
    while pending:
        for sock, _ in poller.poll():
            raw, request_id = pending[sock]
            reply = raw.reply(request_id)
            if reply is None:
                continue
            try:
                got = raw.value("events", reply, {})
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                errors.append(f"{type(exc).__name__}: {exc}")
                got = True
            if not got:  # the wait timed out without the event: park it again
                pending[sock] = (raw, raw.send("events", **_event_request(since)))
                continue
            end = time.monotonic()
            poller.unregister(sock)
            del pending[sock]
    return end, errors[:5]


# ----------------------------------------------------------------------------- workers

def _run_threads(ranks: list[int], fn: Callable[[int], Any]) -> tuple[float, list[str]]:
    """Run ``fn(rank)`` on a thread per rank; returns the last finish time and the errors."""
    ends: list[float] = []
    errors: list[str] = []

    def body(rank: int) -> None:
        try:
            fn(rank)
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            errors.append(f"rank {rank}: {type(exc).__name__}: {exc}")
        ends.append(time.monotonic())

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return max(ends), errors[:5]


def worker(kind: str, target: str, secret_hex: str, ranks: list[int], n: int, conn: Any,
           fanout_clients: str = "poll") -> None:
    threading.stack_size(256 * 1024)
    stores: dict[int, Any] = {}
    ctx = None
    if kind == "ours":
        import zmq

        from torchcomms.control.secrets import derive_keys
        ctx = zmq.Context(io_threads=1)
        ctx.set(zmq.MAX_SOCKETS, 4 * len(ranks) + 64)
        keys = derive_keys(bytes.fromhex(secret_hex))
        make: Callable[[], Any] = lambda: RawControl(ctx, target, keys)
    else:
        import torch.distributed  # noqa: F401 - imported before the timed phases
        make = lambda: TcpStoreRank(int(target))
    import torchcomms.recovery.agreement  # noqa: F401 - imported before the timed phases
    conn.send("ready")
    while True:
        cmd, arg = conn.recv()
        if cmd == "close":
            break
        if cmd == "connect":
            def fn(rank: int) -> None:
                stores[rank] = make()
                stores[rank].connect()
        elif cmd == "rendezvous":
            fn = lambda rank: rendezvous(stores[rank], rank, n)
        elif cmd == "barrier":
            fn = lambda rank: barrier(stores[rank], rank, n)
        elif cmd == "fanout":
            armed = threading.Event()
            conn_ready = threading.Thread(target=lambda: (time.sleep(0.5), armed.set(),
                                                          conn.send(("armed", None))))
            conn_ready.start()
            if kind == "ours" and fanout_clients == "poll":
                conn.send(_fanout_poll([stores[r] for r in ranks], arg))
                continue
            fn = lambda rank: stores[rank].wait_event(arg)
        elif cmd == "agree":
            algo, deadline = arg
            survivors = [r for r in ranks if r != n - 1]
            if algo == "library":
                handle = (lambda rank: RawControlStore(stores[rank])) if kind == "ours" else (
                    lambda rank: stores[rank].store)
                end, errors = _run_threads(survivors, lambda rank: agree_library(handle(rank), rank, n, deadline))
            else:
                body = agree_scan if algo == "scan" else agree_count
                end, errors = _run_threads(survivors, lambda rank: body(stores[rank], rank, n, deadline))
            conn.send((end, errors))
            continue
        elif cmd == "heartbeat":
            seconds, interval, paced = arg
            beats = [0]

            def fn(rank: int) -> None:
                start = time.monotonic()
                tick = start + interval * ((rank * 0.618) % 1.0)  # spread the ranks' phases
                stop = start + seconds
                while True:
                    time.sleep(max(0.0, tick - time.monotonic()))
                    if time.monotonic() >= stop:
                        return
                    asked = stores[rank].beat(rank, interval)
                    beats[0] += 1
                    tick += max(interval, asked) if paced else interval
            end, errors = _run_threads(ranks, fn)
            conn.send(((end, beats[0]), errors))
            continue
        else:
            raise ValueError(cmd)
        conn.send(_run_threads(ranks, fn))
    if ctx is not None:
        for store in stores.values():
            store.sock.close(0)
        ctx.term()


# ----------------------------------------------------------------------------- server probes

def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mib(pid: int) -> tuple[float, float]:
    """(resident now, peak resident) in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            values[line.split(":")[0]] = int(line.split()[1]) / 1024
    return values["VmRSS"], values["VmHWM"]


def start_ours(tmp: Path, max_beat_rate: float | None) -> tuple[subprocess.Popen[str], str, bytes]:
    from torchcomms.control.secrets import new_secret, write_secret_file
    secret = new_secret()
    secret_file = write_secret_file(tmp / "secret", secret)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if max_beat_rate is not None:
        env["TORCHCOMM_CONTROL_MAX_BEAT_RATE"] = str(max_beat_rate)
    proc = subprocess.Popen([sys.executable, "-m", "torchcomms.control", "--port", "0",
                             "--secret-file", str(secret_file), "--heartbeat-limit", "600"],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip(), secret


def start_tcpstore() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", TCPSTORE_SERVER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


# ----------------------------------------------------------------------------- driver

def run_one(kind: str, n: int, procs: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "ours":
            server, target, secret = start_ours(Path(tmp), args.max_beat_rate)
        else:
            server, port = start_tcpstore()
            target, secret = str(port), b""
        ctx = mp.get_context("spawn")
        pipes, workers = [], []
        try:
            for p in range(procs):
                parent, child = ctx.Pipe()
                ranks = list(range(p, n, procs))
                w = ctx.Process(target=worker, args=(kind, target, secret.hex(), ranks, n, child,
                                                     args.fanout_clients), daemon=True)
                w.start()
                pipes.append(parent)
                workers.append(w)
            for pipe in pipes:
                assert pipe.recv() == "ready"
            result: dict[str, Any] = {"kind": kind, "ranks": n,
                                      "rss_start_mib": memory_mib(server.pid)[0]}
            publisher = _publisher(kind, target, secret)
            for phase in PHASES:
                if phase not in args.phases or (phase == "agree" and kind not in args.agree_kinds):
                    continue
                arg: Any = None
                if phase == "fanout":
                    arg = 0
                elif phase == "agree":
                    arg = (args.agree, time.monotonic() + args.agree_deadline)
                elif phase == "heartbeat":
                    arg = (args.hb_seconds, args.hb_interval, args.hb_pace == "on")
                cpu0, t0 = cpu_seconds(server.pid), time.monotonic()
                for pipe in pipes:
                    pipe.send((phase, arg))
                if phase == "fanout":
                    for pipe in pipes:
                        assert pipe.recv()[0] == "armed"
                    time.sleep(1.0 + n / 2000)  # every wait reaches the server
                    cpu0, t0 = cpu_seconds(server.pid), time.monotonic()
                    publisher()
                replies = [pipe.recv() for pipe in pipes]
                wall = time.monotonic() - t0
                cpu = cpu_seconds(server.pid) - cpu0
                errors = [e for _, errs in replies for e in errs]
                if errors:
                    raise RuntimeError(f"{kind} {phase} at {n} ranks: {errors[:3]}")
                if phase == "heartbeat":
                    end = max(r[0][0] for r in replies)
                    beats = sum(r[0][1] for r in replies)
                    result["hb_beats"] = beats
                    result["hb_rate"] = beats / wall
                    result["hb_cpu_share"] = cpu / wall
                    result["hb_cpu_us_per_beat"] = 1e6 * cpu / max(1, beats)
                else:
                    end = max(r[0] for r in replies)
                result[f"{phase}_s"] = end - t0
                result[f"{phase}_cpu_s"] = cpu
                result[f"{phase}_rss_mib"] = memory_mib(server.pid)[0]
                print(f"  {kind:8s} N={n:5d} {phase:10s} {end - t0:8.3f} s  server cpu "
                      f"{cpu:7.2f} s  rss {result[f'{phase}_rss_mib']:7.1f} MiB", flush=True)
            result["rss_peak_mib"] = memory_mib(server.pid)[1]
            for pipe in pipes:
                pipe.send(("close", None))
            for w in workers:
                w.join(30)
            return result
        finally:
            for w in workers:
                if w.is_alive():
                    w.kill()
            server.kill() if kind == "ours" else server.stdin.close()  # type: ignore[union-attr]
            server.wait(10)


def _publisher(kind: str, target: str, secret: bytes) -> Callable[[], None]:
    if kind == "ours":
        from torchcomms.control.client import ControlClient
        client = ControlClient(target, secret, timeout=60)
        client.ping()
        return lambda: client.publish("rank_failed", {"rank": 0, "reason": "scale_bench"}) and None
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", int(target), is_master=False, wait_for_workers=False,
                          timeout=timedelta(seconds=60), use_libuv=True)
    return lambda: store.set("event/rank_failed", b'{"rank": 0, "reason": "scale_bench"}')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="256,1024,4096")
    parser.add_argument("--procs", type=int, default=4, help="worker processes holding the ranks")
    parser.add_argument("--agree", choices=("library", "scan", "count"), default="library",
                        help="library: agree_on_survivors itself; scan, count: store patterns replayed")
    parser.add_argument("--agree-kinds", default="ours,tcpstore",
                        help="which stores run the agreement phase")
    parser.add_argument("--agree-deadline", type=float, default=120.0)
    parser.add_argument("--hb-seconds", type=float, default=6.0)
    parser.add_argument("--hb-interval", type=float, default=0.25)
    parser.add_argument("--hb-pace", choices=("on", "off"), default="on",
                        help="on: ranks beat at the interval our server asks for (as "
                             "HeartbeatSender does); off: at --hb-interval whatever it asks")
    parser.add_argument("--max-beat-rate", type=float, default=None,
                        help="our server's TORCHCOMM_CONTROL_MAX_BEAT_RATE (default: its own)")
    parser.add_argument("--kinds", default="ours,tcpstore")
    parser.add_argument("--fanout-clients", choices=("poll", "threads"), default="poll",
                        help="ours, fanout phase: poll (one thread per worker process polls its "
                             "ranks' sockets) or threads (a thread per rank blocks on its socket)")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help="phases to run (connect always runs)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    args.phases = {"connect", *args.phases.split(",")}
    args.agree_kinds = args.agree_kinds.split(",")
    load0 = os.getloadavg()
    started = datetime.now(timezone.utc)
    results = []
    for n in [int(x) for x in args.ranks.split(",")]:
        for kind in args.kinds.split(","):
            results.append(run_one(kind, n, args.procs, args))
    load1 = os.getloadavg()
    report(results, args, started, load0, load1)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "load": [load0, load1],
                                               "date": started.isoformat()}, indent=1))
    return 0


def report(results: list[dict[str, Any]], args: argparse.Namespace, started: datetime,
           load0: tuple[float, ...], load1: tuple[float, ...]) -> None:
    print(f"\n{started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores shared with other users; "
          f"load average {load0[0]:.1f} -> {load1[0]:.1f}; agreement '{args.agree}', "
          f"heartbeat every {args.hb_interval} s for {args.hb_seconds} s, pacing {args.hb_pace}, "
          f"our max beat rate {args.max_beat_rate or 'default'}")
    by = {(r["kind"], r["ranks"]): r for r in results}
    print("| N | phase | ours s | TCPStore s | ours / TCPStore | ours server CPU s | "
          "TCPStore server CPU s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for n in sorted({r["ranks"] for r in results}):
        ours, tcp = by.get(("ours", n)), by.get(("tcpstore", n))
        for phase in PHASES:
            a = ours.get(f"{phase}_s") if ours else None
            b = tcp.get(f"{phase}_s") if tcp else None
            ca = ours.get(f"{phase}_cpu_s") if ours else None
            cb = tcp.get(f"{phase}_cpu_s") if tcp else None
            ratio = f"{a / b:.2f}" if a is not None and b else "-"
            fmt = lambda v: "-" if v is None else f"{v:.3f}"
            print(f"| {n} | {phase} | {fmt(a)} | {fmt(b)} | {ratio} | {fmt(ca)} | {fmt(cb)} |")
    print("\n| N | store | heartbeats/s | server CPU share | server CPU µs / beat | "
          "RSS start MiB | RSS peak MiB |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['ranks']} | {r['kind']} | {r.get('hb_rate', 0):.0f} | "
              f"{100 * r.get('hb_cpu_share', 0):.1f} % | {r.get('hb_cpu_us_per_beat', 0):.1f} | "
              f"{r['rss_start_mib']:.1f} | {r['rss_peak_mib']:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
