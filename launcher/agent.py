"""The per-node agent of ``torchcomms-run``.

Every node runs one agent. The agent on the rendezvous host also hosts the job's control
plane (store + event bus) and is the job's *decider*: it runs the rendezvous, watches the
other agents' heartbeats, applies the failure policy and writes the final decision. Other
agents start their workers, report failures (``rank_failed``) and results, and follow the
decider's ``stop``/``decision`` keys.

Store keys of round ``r`` (under ``torchcomms-run/job/<r>/``): ``stop`` (the decider asks
every agent to stop its workers; JSON ``{action, reason}``), ``failed/<rank>``,
``result/<node_rank>`` (a node's worker results, JSON list), ``decision`` (JSON
``{action: restart|exit, exit_code, reason}``) and ``ack/<node_rank>``. Agent heartbeats are
counters under ``torchcomms-run/hb/<agent_id>``.

A follower waits about ``heartbeat_timeout`` (``--rdzv-conf``) for any answer of the
rendezvous host, in every phase (its store calls and heartbeats are bounded by it, and its
waits are polls of such calls): then it takes the host for lost, stops its workers and
raises :class:`ControlPlaneLostError` naming the host's address and what it was doing. Once
it has read the job's final ``exit`` decision, though, the job's end is known: a host lost
before the ack landed is only warned of, and the agent exits with the job's code.

A worker that SIGKILL cannot end is given up as unreapable after the supervisor's bounded
wait and counts as a failed worker that ended then (policy, results and exit code as usual;
the agent never waits for it again, at exit neither). A restarted group runs beside it
without sharing anything with it: new attempt directories (logs, error files), a master port
picked afresh, its heartbeat member forgotten, its output no longer read (no reader thread
stays behind for it), and its late exit, if the kernel ever lets it go, ignored (it is never
taken for its successor's).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from torchcomms.control.errors import ControlAuthError, ControlError, ControlUnavailableError
from torchcomms.control.secrets import load_secret, new_secret, parse_secret, write_secret_file

from .args import LaunchConfig
from .control_plane import ControlPlane, lost
from .env import JobEndpoints, WorkerPlacement, worker_env
from .errors import read_error_file
from .exceptions import ControlPlaneLostError, LauncherError, UsageError
from .output import STDERR, STDOUT, Console, OutputPump, StreamRoute
from .rendezvous import KEY_ROOT, JoinRecord, NodeSlot, Plan, host_round, join_round, wait_plan
from .summary import describe_end, job_exit_code, render_root_cause, render_table, root_cause, stuck_hint
from .supervisor import Worker, WorkerGroup, WorkerResult, WorkerSpec, proc_state

__all__ = ["Agent", "Decision"]


class _Interrupted(BaseException):
    """Raised from the signal handler while no worker runs (rendezvous, waits)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass(frozen=True)
class Decision:
    """What the decider concluded at the end of a round."""

    action: str  # "restart" or "exit"
    exit_code: int
    reason: str

    def to_json(self) -> bytes:
        return json.dumps({"action": self.action, "exit_code": self.exit_code,
                           "reason": self.reason}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Decision:
        d = json.loads(raw)
        return cls(action=str(d["action"]), exit_code=int(d["exit_code"]), reason=str(d["reason"]))


def _job_key(round_: int, *parts: str) -> str:
    return "/".join((KEY_ROOT, "job", str(round_), *parts))


def _hb_key(agent_id: str) -> str:
    return f"{KEY_ROOT}/hb/{agent_id}"


def _is_local_address(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_UDP)
    except OSError:
        return False
    for family, _, _, _, addr in infos:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.bind((addr[0], 0))
            return True
        except OSError:
            continue
    return False


def _route_addr(host: str, port: int) -> str:
    """The local address this node uses to reach ``host`` (what peers can reach us at)."""
    try:
        family = socket.getaddrinfo(host, port, proto=socket.IPPROTO_UDP)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, port or 9))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class Agent:
    """One node's agent; :meth:`run` returns the launcher's exit code."""

    def __init__(self, cfg: LaunchConfig, console: Console,
                 environ: Mapping[str, str] | None = None, python: str | None = None) -> None:
        self.cfg = cfg
        self.console = console
        self.environ = dict(os.environ if environ is None else environ)
        self.python = python or sys.executable
        self.hostname = socket.gethostname()
        self.agent_id = f"{self.hostname}-{os.getpid()}-{os.urandom(3).hex()}"
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.control: ControlPlane | None = None
        self.group: WorkerGroup | None = None
        self._phase = "setup"
        self._signal: int | None = None
        self._round = 0
        self._slot: NodeSlot | None = None
        self._stopping_local = False
        self._stop_action: str | None = None
        self._run_dir: Path | None = None
        self._logs_root: Path | None = None
        self._keep_logs = False
        self._hb_stop = threading.Event()
        self._hb_client: Any = None
        self._old_handlers: dict[int, Any] = {}
        self._abandoned: list[tuple[int, Worker]] = []  # (attempt, worker) given up unreaped

    # ------------------------------------------------------------------ entry point

    def run(self) -> int:
        self._install_signal_handlers()
        try:
            self._setup()
            return self._run_rounds()
        except _Interrupted as exc:
            self.console.event(f"interrupted by {signal.Signals(exc.signum).name}")
            return 128 + exc.signum
        finally:
            self._teardown()

    # ------------------------------------------------------------------ setup / teardown

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.cfg.signals_to_handle:
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        first = self._signal is None
        self._signal = signum
        if self._phase == "running":
            if not first and self.group is not None:
                # A second signal cuts the grace period short, even while the main thread
                # is busy waiting for the workers to stop.
                for w in self.group.workers:
                    w.signal_group(signal.SIGKILL)
            self.events.put(("signal", signum if first else -signum))
        elif first:
            raise _Interrupted(signum)

    def _load_secret(self) -> tuple[bytes, str]:
        cfg = self.cfg
        try:
            if cfg.job_secret_file:
                text = Path(cfg.job_secret_file).read_text(encoding="ascii")
                source = f"--job-secret-file {cfg.job_secret_file}"
                return parse_secret(text, source=source), source
            secret = load_secret(self.environ, required=False)
        except (ControlAuthError, OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot use the job secret: {exc}") from None
        if secret is not None:
            src = ("TORCHCOMM_CONTROL_SECRET_FILE" if self.environ.get(
                "TORCHCOMM_CONTROL_SECRET_FILE") else "TORCHCOMM_CONTROL_SECRET")
            return secret, src
        if cfg.max_nodes > 1:
            raise UsageError(
                "a multi-node job needs the same secret on every node: pass --job-secret-file "
                "FILE (64 hex characters, e.g. from `openssl rand -hex 32`) or set "
                "TORCHCOMM_CONTROL_SECRET"
            )
        return new_secret(), "a fresh secret"

    def _wants_host(self) -> bool | None:
        cfg = self.cfg
        if cfg.rdzv_conf.is_host is not None:
            return cfg.rdzv_conf.is_host
        if cfg.max_nodes == 1:
            return True
        if cfg.node_rank is not None:
            return cfg.node_rank == 0
        return None if _is_local_address(cfg.rdzv_host) else False

    def _setup(self) -> None:
        cfg = self.cfg
        secret, source = self._load_secret()
        self._run_dir = Path(tempfile.mkdtemp(prefix=f"torchcomms-run-{cfg.rdzv_id}-"))
        self._secret_file = str(write_secret_file(self._run_dir / "job.secret", secret))
        if cfg.log_dir:
            self._logs_root = Path(cfg.log_dir) / cfg.rdzv_id
            self._keep_logs = True
        elif any(cfg.redirects.values()) or any(cfg.tee.values()):
            self._logs_root = Path(tempfile.mkdtemp(prefix=f"torchcomms-run-logs-{cfg.rdzv_id}-"))
            self._keep_logs = True
            self.console.event(f"worker logs go to {self._logs_root}")
        else:
            self._logs_root = self._run_dir
        want = self._wants_host()
        endpoint = cfg.rdzv_endpoint
        if want is not False:
            local_only = cfg.max_nodes == 1 and cfg.rdzv_host in ("127.0.0.1", "localhost")
            try:
                self.control = ControlPlane.host(
                    bind_host="127.0.0.1" if local_only else "0.0.0.0", port=cfg.rdzv_port,
                    advertise_host=cfg.rdzv_host, secret=secret, run_id=cfg.rdzv_id)
            except ControlUnavailableError as exc:
                if want:
                    raise LauncherError(f"cannot host the rendezvous at {endpoint}: {exc}") from None
        if self.control is None:
            self.control = ControlPlane.join(
                address=f"tcp://{cfg.rdzv_host}:{cfg.rdzv_port}", secret=secret,
                timeout=cfg.rdzv_conf.join_timeout, secret_source=source,
                request_timeout=self._patience)
            self._start_heartbeats(secret)
        if cfg.local_addr:
            self._addr = cfg.local_addr
        elif self.control.is_host:
            self._addr = cfg.rdzv_host
        else:
            self._addr = _route_addr(cfg.rdzv_host, cfg.rdzv_port)
        if self.control.is_host:
            self.control.subscribe(["rank_failed"], self._on_remote_event)
        else:
            self.control.subscribe(["rank_failed", "job_stopping"], self._on_remote_event)

    def _teardown(self) -> None:
        if self.group is not None:
            self.group.kill_all()  # never waits again for a worker given up already
        for attempt, w in self._abandoned:
            self.console.event(
                f"exiting without reaping rank {w.result.rank} of attempt {attempt} (pid {w.pid}, "
                f"state {proc_state(w.pid) or 'unknown'}): SIGKILL is pending, so it ends when "
                f"the kernel lets it go, and its new parent (init) reaps it")
        self._hb_stop.set()
        if self._hb_client is not None:
            try:
                self._hb_client.close()
            except ControlError:
                pass
        if self.control is not None:
            self.control.close()
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)

    # ------------------------------------------------------------------ heartbeats

    @property
    def _patience(self) -> float:
        """How long a follower waits for any answer of the rendezvous host (each store call
        and heartbeat) before it takes the host for lost: the heartbeat timeout."""
        return max(self.cfg.rdzv_conf.heartbeat_timeout, 0.5)

    def _start_heartbeats(self, secret: bytes) -> None:
        from torchcomms.control.client import ControlClient

        assert self.control is not None
        self._hb_client = ControlClient(self.control.address, secret, timeout=self._patience)
        threading.Thread(target=self._heartbeat_loop, name="agent-heartbeat", daemon=True).start()

    def _heartbeat_loop(self) -> None:
        conf = self.cfg.rdzv_conf
        key = _hb_key(self.agent_id)
        last_ok = time.monotonic()
        while not self._hb_stop.wait(conf.heartbeat_interval):
            try:
                self._hb_client.add(key, 1)
                last_ok = time.monotonic()
            except ControlError as exc:
                if self._hb_stop.is_set():
                    return
                if time.monotonic() - last_ok >= conf.heartbeat_timeout:
                    self.events.put(("host_lost", exc))
                    return

    # ------------------------------------------------------------------ events from others

    def _on_remote_event(self, topic: str, payload: dict[str, Any]) -> None:
        if topic == "rank_failed" and payload.get("reason") == "heartbeat" \
                and "member" in payload:
            self.events.put(("hung", payload))  # the server saw a rank's heartbeats stop
        elif topic == "rank_failed" and self.control is not None and self.control.is_host:
            self.events.put(("remote_failed", payload))
        elif topic == "job_stopping":
            self.events.put(("stop", payload))

    def _on_worker_exit(self, worker: Worker) -> None:
        """Runs on the worker's waiter thread, right after it exited, or on the thread that
        gave it up as unreapable (it is never called again for that worker)."""
        r = worker.result
        assert self.control is not None
        if r.unreapable:
            self._abandoned.append((self._round, worker))
            self._log_unreapable(worker)
        try:  # its heartbeats (if any) stopped for a reason we already know
            self.control.forget_member(f"rank/{r.rank}")
        except ControlError:
            pass
        if not r.failed or self._stopping_local:
            return
        reason = "unreapable" if r.unreapable else "killed" if r.signal is not None else "exited"
        payload: dict[str, Any] = {
            "rank": r.rank, "host": r.host, "node_rank": r.node_rank, "round": self._round,
            "reason": reason, "exit_code": r.exit_code, "signal": r.signal,
        }
        if r.unreapable:
            payload.update(pid=r.pid, state=r.state)
        assert self.control is not None
        try:
            self.control.publish("rank_failed", payload)
            self.control.kv.set(_job_key(self._round, "failed", str(r.rank)),
                                json.dumps(payload).encode())
        except ControlError:
            pass  # the decider also learns from this node's results

    # ------------------------------------------------------------------ rounds

    def _run_rounds(self) -> int:
        round_ = 0
        while True:
            plan = self._rendezvous(round_)
            decision = self._run_round(plan)
            if decision.action != "restart":
                return decision.exit_code
            round_ += 1

    def _rendezvous(self, round_: int) -> Plan:
        cfg = self.cfg
        assert self.control is not None
        kv = self.control.kv
        me = JoinRecord(agent_id=self.agent_id, host=self.hostname, addr=self._addr,
                        nproc=cfg.nproc_per_node, node_rank=cfg.node_rank,
                        master_port=_free_port())
        doing = f"joining rendezvous round {round_}"
        try:
            join_round(kv, round_, me)
            if self.control.is_host:
                plan = host_round(kv, round_, min_nodes=cfg.min_nodes, max_nodes=cfg.max_nodes,
                                  join_timeout=cfg.rdzv_conf.join_timeout,
                                  last_call_timeout=cfg.rdzv_conf.last_call_timeout,
                                  endpoint=cfg.rdzv_endpoint if cfg.rdzv_port else
                                  self.control.address)
            else:
                doing = f"waiting for the plan of rendezvous round {round_}"
                wait = cfg.rdzv_conf.join_timeout + cfg.rdzv_conf.last_call_timeout + 60.0
                plan = wait_plan(kv, round_, me, timeout=wait)
        except ControlError as exc:
            # A follower's calls are bounded by its patience: any failure means the host is
            # gone (stopped, dead or cut off). The host's own store is in-process.
            if self.control.is_host and not isinstance(exc, ControlUnavailableError):
                raise
            raise lost(exc, self.control.address, doing) from None
        if cfg.is_multinode:
            slot = plan.slot_of(self.agent_id)
            assert slot is not None
            self.console.event(
                f"round {round_}: {len(plan.nodes)} node(s), world size {plan.world_size}; "
                f"this is node {slot.node_rank} (ranks {slot.rank_offset}-"
                f"{slot.rank_offset + slot.nproc - 1})")
        return plan

    def _worker_specs(self, plan: Plan, slot: NodeSlot) -> list[WorkerSpec]:
        cfg = self.cfg
        assert self.control is not None and self._logs_root is not None
        job = JobEndpoints(run_id=cfg.rdzv_id, master_addr=plan.master_addr,
                           master_port=plan.master_port, control_addr=self.control.address,
                           secret_file=self._secret_file, restart_count=plan.round,
                           max_restarts=cfg.max_restarts)
        argv = cfg.worker_argv(self.python)
        specs = []
        for lr in range(slot.nproc):
            rank = slot.rank_offset + lr
            placement = WorkerPlacement(rank=rank, local_rank=lr, world_size=plan.world_size,
                                        local_world_size=slot.nproc, node_rank=slot.node_rank,
                                        num_nodes=len(plan.nodes), role=cfg.role)
            wdir = self._logs_root / f"attempt_{plan.round}" / str(rank)
            wdir.mkdir(parents=True, exist_ok=True)
            error_file = wdir / "error.json"
            error_file.unlink(missing_ok=True)
            env = worker_env(self.environ, placement, job, error_file=str(error_file))
            keep = self._keep_logs
            routes = {
                bit: StreamRoute(
                    to_console=(cfg.local_ranks_filter is None or lr in cfg.local_ranks_filter)
                    and not cfg.redirects.get(lr, 0) & bit,
                    log_file=(wdir / ("stdout.log" if bit == STDOUT else "stderr.log"))
                    if keep and (cfg.log_dir or (cfg.redirects.get(lr, 0) | cfg.tee.get(lr, 0)) & bit)
                    else None,
                )
                for bit in (STDOUT, STDERR)
            }
            prefix = cfg.line_prefix.format(host=self.hostname, rank=rank, local_rank=lr,
                                            node_rank=slot.node_rank, role=cfg.role)
            meta = {"host": self.hostname, "rank": rank, "local_rank": lr,
                    "node_rank": slot.node_rank, "attempt": plan.round}
            specs.append(WorkerSpec(placement=placement, argv=argv, env=env, host=self.hostname,
                                    error_file=str(error_file),
                                    output=OutputPump(self.console, prefix, meta, routes)))
        return specs

    def _run_round(self, plan: Plan) -> Decision:
        slot = plan.slot_of(self.agent_id)
        assert slot is not None and self.control is not None
        self._round, self._slot = plan.round, slot
        self._stopping_local = False
        self._stop_action = None
        self._stop_reason = ""
        self._exits_seen = 0
        self._round_started = time.time()
        self._hung: dict[int, float] = {}
        for rank in range(slot.rank_offset, slot.rank_offset + slot.nproc):
            try:  # a predecessor's stale heartbeat member must not outlive it
                self.control.forget_member(f"rank/{rank}")
            except ControlUnavailableError as exc:
                if not self.control.is_host:  # gone since the plan: start no workers
                    raise lost(exc, self.control.address,
                               f"starting the workers of round {plan.round}") from None
            except ControlError:
                pass
        specs = self._worker_specs(plan, slot)
        self.group = WorkerGroup(on_exit=self._on_worker_exit)
        self._phase = "running"
        try:
            if self._signal is not None:  # a signal raced the start
                raise _Interrupted(self._signal)
            self.group.start(specs)
            if self.control.is_host:
                return self._decide_loop(plan)
            return self._follow_loop(plan)
        finally:
            self._phase = "idle"

    # ------------------------------------------------------------------ local workers

    def _stop_local(self, first: int = signal.SIGTERM) -> None:
        assert self.group is not None
        if self._stopping_local:
            return
        self._stopping_local = True
        self.group.stop(self.cfg.grace_period, first=first)  # gives up the unkillable ones

    def _log_unreapable(self, w: Worker) -> None:
        r = w.result
        assert self.group is not None
        state = r.state or f"unknown (/proc/{r.pid}/stat unreadable)"
        self.console.event(
            f"rank {r.rank} (pid {r.pid}) on {r.host} is UNREAPABLE: not exited "
            f"{self.group.kill_wait:g} s after SIGKILL; process state {state}{stuck_hint(state, ' - ')}. "
            f"Giving it up as lost: nothing waits for it any longer",
            rank=r.rank, pid=r.pid, state=r.state)

    @staticmethod
    def _failure(r: WorkerResult) -> str:
        return f"rank {r.rank} is unreapable" if r.unreapable else f"rank {r.rank} failed"

    def _local_results(self) -> list[WorkerResult]:
        assert self.group is not None
        out = []
        for w in self.group.workers:
            r = w.result
            if r.failed and r.error_file:
                err = read_error_file(r.error_file)
                if err is not None:
                    r.error_message, r.error_traceback = err.message, err.traceback
            out.append(r)
        return out

    def _report_local(self) -> None:
        assert self.control is not None and self._slot is not None
        data = json.dumps([r.to_dict() for r in self._local_results()]).encode()
        self.control.kv.set(_job_key(self._round, "result", str(self._slot.node_rank)), data)

    def _log_exit(self, w: Worker) -> None:
        r = w.result
        if r.failed and not r.unreapable and not self._stopping_local:
            self.console.event(f"rank {r.rank} on {r.host} failed ({describe_end(r)})")

    def _handle_signal(self, signum: int) -> None:
        if signum < 0:  # a second signal: no more grace
            assert self.group is not None
            self.group.kill_all()
            return
        name = signal.Signals(signum).name
        self.console.event(f"received {name}: stopping the workers "
                           f"(grace {self.cfg.grace_period:g} s)")

    def _handle_hung(self, payload: dict[str, Any]) -> None:
        """A local rank stopped sending heartbeats: ask it for a flight-recorder dump
        (SIGUSR1) now and SIGKILL it when the dump window ends (see :meth:`_reap_hung`)."""
        assert self.group is not None
        if self._stopping_local:
            return
        rank = payload.get("rank")
        for w in self.group.workers:
            if w.result.rank == rank and w.alive and rank not in self._hung:
                silent = payload.get("silent_s")
                if isinstance(silent, (int, float)) and time.time() - w.result.started < silent:
                    continue  # the silence is older than this worker: a predecessor's
                self.console.event(
                    f"rank {rank} on {w.result.host} is hung (no heartbeat for {silent} s): "
                    f"asking for a flight-recorder dump (SIGUSR1), then stopping it")
                w.signal_group(signal.SIGUSR1)
                self._hung[rank] = time.monotonic() + min(2.0, self.cfg.grace_period)

    def _reap_hung(self) -> None:
        """SIGKILL hung ranks whose dump window ended; give up those that still have not
        exited ``kill_wait`` later (reported like an exit, see ``WorkerGroup.abandon``)."""
        assert self.group is not None
        now = time.monotonic()
        for w in self.group.workers:
            deadline = self._hung.get(w.result.rank)
            if deadline is None or now < deadline or not w.alive:
                continue
            if now >= deadline + self.group.kill_wait:
                self.group.abandon(w)
            else:
                w.signal_group(signal.SIGKILL)

    # ------------------------------------------------------------------ decider (host)

    def _broadcast_stop(self, action: str, reason: str, first: int = signal.SIGTERM) -> None:
        assert self.control is not None
        if self._stop_action is not None:
            return
        self._stop_action, self._stop_reason = action, reason
        body = json.dumps({"action": action, "reason": reason}).encode()
        try:
            self.control.kv.set(_job_key(self._round, "stop"), body)
            self.control.publish("job_stopping", {"reason": reason, "action": action,
                                                  "round": self._round})
        except ControlError:
            pass
        self._stop_local(first)

    def _apply_policy(self, what: str) -> None:
        cfg = self.cfg
        if self._stop_action is not None:
            return
        if cfg.on_failure == "shrink":
            self.console.event(f"{what}; survivors keep running (--on-failure shrink)")
            return
        if cfg.on_failure == "restart" and self._round < cfg.max_restarts:
            self.console.event(f"{what}; restarting all workers "
                               f"(restart {self._round + 1} of {cfg.max_restarts})")
            self._broadcast_stop("restart", what)
        else:
            extra = " (no restarts left)" if cfg.on_failure == "restart" else ""
            self.console.event(f"{what}; stopping the job{extra}")
            self._broadcast_stop("exit", what)

    def _decide_loop(self, plan: Plan) -> Decision:
        assert self.control is not None and self.group is not None and self._slot is not None
        cfg, kv = self.cfg, self.control.kv
        me = self._slot.node_rank
        remote = {n.node_rank: n for n in plan.nodes if n.node_rank != me}
        hb_seen: dict[int, tuple[int, float, float]] = {
            nr: (-1, time.monotonic(), time.time()) for nr in remote}
        lost_at: dict[int, float] = {}
        reported: set[int] = set()
        known_failed: set[int] = set()
        local_reported = False
        next_check = 0.0
        while True:
            try:
                kind, item = self.events.get(timeout=cfg.monitor_interval)
            except queue.Empty:
                kind, item = "tick", None
            if kind == "signal":
                self._handle_signal(item)
                if item > 0:
                    self._broadcast_stop("exit", f"agent received {signal.Signals(item).name}",
                                         first=item)
            elif kind == "hung":
                self._handle_hung(item)
            elif kind == "remote_failed":
                rank = item.get("rank")
                if item.get("round") == self._round and item.get("node_rank") != me \
                        and item.get("reason") in ("exited", "killed", "unreapable") \
                        and rank not in known_failed:
                    known_failed.add(rank)
                    if item.get("reason") == "unreapable":
                        self.console.event(
                            f"rank {rank} (pid {item.get('pid')}) on {item.get('host')} is "
                            f"unreapable (state {item.get('state') or 'unknown'})")
                        self._apply_policy(f"rank {rank} is unreapable")
                    else:
                        self.console.event(f"rank {rank} on {item.get('host')} failed "
                                           f"({self._describe_event(item)})")
                        self._apply_policy(f"rank {rank} failed")
            self._reap_hung()
            for w in self._drain_exits():
                if w.result.failed and not self._stopping_local:
                    self._apply_policy(self._failure(w.result))
            now = time.monotonic()
            if now >= next_check:
                next_check = now + min(cfg.monitor_interval, cfg.rdzv_conf.heartbeat_interval)
                try:
                    for nr in remote:
                        if nr in lost_at or nr in reported:
                            continue
                        if kv.check([_job_key(self._round, "result", str(nr))]):
                            reported.add(nr)
                            continue
                        value = kv.add(_hb_key(remote[nr].agent_id), 0)
                        last, since, since_wall = hb_seen[nr]
                        if value != last:
                            hb_seen[nr] = (value, now, time.time())
                        elif now - since >= cfg.rdzv_conf.heartbeat_timeout:
                            lost_at[nr] = since_wall
                            self._node_lost(remote[nr], now - since)
                    if self._stop_action is None:
                        for key in kv.keys(_job_key(self._round, "failed") + "/"):
                            rank = int(key.rsplit("/", 1)[1])
                            slot_nr = self._node_of(plan, rank)
                            if rank not in known_failed and slot_nr != me:
                                known_failed.add(rank)
                                self._apply_policy(f"rank {rank} failed")
                except ControlError as exc:
                    self.console.event(f"control plane error while monitoring: {exc}")
            if not local_reported and self._all_exits_seen():
                self._report_local()
                local_reported = True
            if local_reported and all(nr in reported or nr in lost_at for nr in remote):
                return self._finish(plan, lost_at)

    def _drain_exits(self) -> list[Worker]:
        """Exits not handled yet (each worker is returned exactly once)."""
        assert self.group is not None
        out = []
        while True:
            try:
                w = self.group.exits.get_nowait()
            except queue.Empty:
                return out
            self._exits_seen += 1
            self._log_exit(w)
            out.append(w)

    def _all_exits_seen(self) -> bool:
        assert self.group is not None
        return self._exits_seen == len(self.group.workers)

    @staticmethod
    def _describe_event(payload: dict[str, Any]) -> str:
        sig = payload.get("signal")
        if isinstance(sig, int):
            try:
                return signal.Signals(sig).name
            except ValueError:
                return f"signal {sig}"
        return f"exit {payload.get('exit_code')}"

    @staticmethod
    def _node_of(plan: Plan, rank: int) -> int | None:
        for n in plan.nodes:
            if n.rank_offset <= rank < n.rank_offset + n.nproc:
                return n.node_rank
        return None

    def _node_lost(self, node: NodeSlot, silent: float) -> None:
        assert self.control is not None
        ranks = list(range(node.rank_offset, node.rank_offset + node.nproc))
        self.console.event(f"node {node.node_rank} ({node.host}, ranks {ranks[0]}-{ranks[-1]}) "
                           f"lost: no heartbeat for {silent:.1f} s")
        try:
            self.control.publish("node_lost", {"node_rank": node.node_rank, "ranks": ranks,
                                               "host": node.host, "reason": "heartbeat"})
            for rank in ranks:
                self.control.publish("rank_failed", {"rank": rank, "host": node.host,
                                                     "reason": "heartbeat",
                                                     "node_rank": node.node_rank,
                                                     "round": self._round})
        except ControlError:
            pass
        self._apply_policy(f"node {node.node_rank} lost")

    def _collect(self, plan: Plan, lost_at: dict[int, float]) -> list[WorkerResult]:
        assert self.control is not None and self._slot is not None
        results: list[WorkerResult] = []
        for node in plan.nodes:
            if node.node_rank in lost_at:
                for lr in range(node.nproc):
                    results.append(WorkerResult(
                        rank=node.rank_offset + lr, local_rank=lr, node_rank=node.node_rank,
                        host=node.host, pid=None, started=self._round_started,
                        ended=lost_at[node.node_rank], lost=True))
                continue
            raw = self.control.kv.get(_job_key(self._round, "result", str(node.node_rank)),
                                      timeout=30.0)
            results.extend(WorkerResult.from_dict(d) for d in json.loads(raw))
        return results

    def _finish(self, plan: Plan, lost_at: dict[int, float]) -> Decision:
        assert self.control is not None
        cfg = self.cfg
        results = self._collect(plan, lost_at)
        if self._stop_action == "restart":
            decision = Decision("restart", 0, self._stop_reason)
        else:
            code = job_exit_code(results, cfg.on_failure)
            if self._signal is not None:
                code = 128 + abs(self._signal)
            decision = Decision("exit", code, self._stop_reason or "all workers exited")
        kv = self.control.kv
        kv.set(_job_key(self._round, "decision"), decision.to_json())
        cause = root_cause(results)
        if decision.action == "restart":
            if cause is not None:
                self.console.event(f"attempt {self._round} ended; root cause rank {cause.rank} "
                                   f"on {cause.host} ({describe_end(cause)})")
            return decision
        if cfg.summary and self.console.json_lines:
            self.console.event(
                "job finished", run_id=cfg.rdzv_id, exit_code=decision.exit_code,
                root_cause=None if cause is None else cause.to_dict(),
                workers=[r.to_dict() for r in sorted(results, key=lambda r: r.rank)])
        elif cfg.summary:
            title = f"torchcomms-run: job {cfg.rdzv_id} finished with exit code {decision.exit_code}"
            text = render_table(results, title=title)
            if cause is not None:
                text += render_root_cause(cause)
            self.console.text(text)
        # Keep the store up until every live agent has read the decision.
        waiting = [n.node_rank for n in plan.nodes
                   if n.node_rank != self._slot.node_rank and n.node_rank not in lost_at]
        deadline = time.monotonic() + max(5.0, 2 * cfg.rdzv_conf.heartbeat_timeout)
        while waiting and time.monotonic() < deadline:
            waiting = [nr for nr in waiting
                       if not kv.check([_job_key(self._round, "ack", str(nr))])]
            if waiting:
                time.sleep(0.02)
        return decision

    # ------------------------------------------------------------------ follower

    def _follow_loop(self, plan: Plan) -> Decision:
        assert self.control is not None and self.group is not None and self._slot is not None
        cfg, kv = self.cfg, self.control.kv
        stop_key = _job_key(self._round, "stop")
        decision_key = _job_key(self._round, "decision")
        local_reported = False
        leaving: int | None = None
        doing = f"supervising the workers of round {self._round}"
        while True:
            try:
                kind, item = self.events.get(timeout=cfg.monitor_interval)
            except queue.Empty:
                kind, item = "tick", None
            try:
                if kind == "signal":
                    self._handle_signal(item)
                    if item > 0:
                        leaving = item
                        self._stop_local(first=item)
                elif kind == "host_lost":  # the heartbeat thread heard nothing for too long
                    self._leave_lost_host(item, doing)
                elif kind == "stop" and item.get("round") == self._round:
                    self._stop_local()
                elif kind == "hung":
                    self._handle_hung(item)
                self._reap_hung()
                self._drain_exits()
                if not self._stopping_local and kv.check([stop_key]):
                    self._stop_local()
                if not local_reported and self._all_exits_seen():
                    doing = f"publishing the results of round {self._round}"
                    self._report_local()
                    local_reported = True
                    if leaving is not None:
                        return Decision("exit", 128 + leaving, "signal")
                    doing = f"waiting for the decision of round {self._round}"
                if local_reported and kv.check([decision_key]):
                    decision = Decision.from_json(kv.get(decision_key, timeout=0))
                    doing = f"acknowledging the decision of round {self._round}"
                    self._acknowledge(decision)
                    if decision.action == "exit":
                        self.console.event(f"job finished with exit code {decision.exit_code} "
                                           f"(summary on the rendezvous host)")
                    return decision
            except ControlError as exc:  # the host stopped answering (each call is bounded)
                self._leave_lost_host(exc, doing)

    def _acknowledge(self, decision: Decision) -> None:
        """Tell the host this agent read ``decision``. An ``exit`` decision is the job's end:
        a host lost before the ack landed is only warned of then (this agent exits with the
        job's code); a ``restart`` needs the host, so losing it raises ``ControlError``."""
        assert self.control is not None and self._slot is not None
        if decision.action == "exit":
            self.control.close_subscriptions()
        try:
            self.control.kv.set(_job_key(self._round, "ack", str(self._slot.node_rank)), b"1")
        except ControlError as exc:
            if decision.action != "exit":
                raise
            self.console.event(
                f"warning: lost the rendezvous host at {self.control.address} after the job's "
                f"decision (exit code {decision.exit_code}), before this agent's "
                f"acknowledgement landed: {exc}")

    def _leave_lost_host(self, exc: BaseException, doing: str) -> NoReturn:
        """Stop the local workers and raise :class:`ControlPlaneLostError` naming the host
        and what this agent was ``doing``."""
        assert self.control is not None and self.group is not None
        err = lost(exc, self.control.address, doing)
        if not self._stopping_local and self.group.alive():
            self.console.event(f"the rendezvous host at {self.control.address} stopped "
                               f"answering; stopping the workers "
                               f"(grace {self.cfg.grace_period:g} s)")
        self._stop_local()
        raise err from None
