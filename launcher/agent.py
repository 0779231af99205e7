"""The per-node agent of ``torchcomms-run``: set-up, signals and the job's rounds.

Every node runs one agent. The agent on the rendezvous host also hosts the job's control
plane (store + event bus) and is the job's *decider* (:mod:`launcher.decider`): it runs the
rendezvous, applies the failure policy and writes each round's decision. Other agents are
*followers* (:mod:`launcher.follower`): they start their workers, report failures and
results, send their node's heartbeats to the control server and follow the decider. Each
round's local workers, their exits and their liveness live in :mod:`launcher.rounds`.

A worker that SIGKILL cannot end is given up as unreapable after the supervisor's bounded
wait and counts as a failed worker that ended then (policy, results and exit code as usual;
the agent never waits for it again, at exit neither). A restarted group runs beside it
without sharing anything with it: new attempt directories (logs, error files), a master port
picked afresh, its heartbeat member forgotten, its output no longer read (no reader thread
stays behind for it), and its late exit, if the kernel ever lets it go, ignored (it is never
taken for its successor's).
"""

from __future__ import annotations

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
from pathlib import Path
from typing import Any

from torchcomms.control.errors import ControlAuthError, ControlError, ControlUnavailableError
from torchcomms.control.secrets import load_secret, new_secret, read_secret_file, write_secret_file

from .args import LaunchConfig
from .control_plane import ControlPlane, lost
from .decider import Decider, stop_between_rounds
from .env import node_env
from .exceptions import LauncherError, UsageError
from .follower import Follower
from .forks import ForkServer
from .orphans import become_subreaper, is_subreaper
from .output import Console
from .rendezvous import JoinRecord, Plan, host_round, join_round, wait_plan
from .rounds import Decision, Round
from .supervisor import Worker, WorkerGroup, proc_state
from .watch import Watch

__all__ = ["Agent", "Decision"]


class _Interrupted(BaseException):
    """Raised from the signal handler while no worker runs (rendezvous, waits)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


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
        #: what the running round's loop handles next: signals, remote events (kind, item)
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.control: ControlPlane | None = None
        self.group: WorkerGroup | None = None  # the running round's workers
        self.signal_received: int | None = None
        self.signal_at: float | None = None  # when the first one came (time.time())
        self.secret_file: str | None = None
        self.logs_root: Path | None = None
        self.keep_logs = False
        self.abandoned: list[tuple[int, Worker]] = []  # (attempt, worker) given up unreaped
        #: ends what the workers started should this agent be SIGKILLed (see .watcher)
        self.watch: Watch | None = None
        #: forks the workers (--fork-server), see .forks
        self.fork_server: ForkServer | None = None
        self._phase = "setup"
        self._round = 0  # the round being joined or run
        self._run_dir: Path | None = None
        self._old_handlers: dict[int, Any] = {}

    @property
    def patience(self) -> float:
        """How long a follower waits for any answer of the rendezvous host (each store call
        and heartbeat) before it takes the host for lost: the heartbeat timeout."""
        return max(self.cfg.rdzv_conf.heartbeat_timeout, 0.5)

    # ------------------------------------------------------------------ entry point

    def run(self) -> int:
        self._install_signal_handlers()
        become_subreaper()  # what a worker leaves behind is ended with its group (see .orphans)
        try:
            self._start_watch()
            self._start_fork_server()
            self._setup()
            return self._run_rounds()
        except _Interrupted as exc:
            name = signal.Signals(exc.signum).name
            self.console.event(f"interrupted by {name}")
            if self.control is not None and self.control.is_host and self.cfg.is_multinode:
                stop_between_rounds(self.control.kv, self._round, self.agent_id, 128 + exc.signum,
                                    f"the rendezvous host received {name}: the job stops",
                                    wait_s=self.cfg.grace_period + 2 * self.patience)
            return 128 + exc.signum
        finally:
            self._teardown()

    # ------------------------------------------------------------------ signals

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.cfg.signals_to_handle:
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        first = self.signal_received is None
        self.signal_received = signum
        if first:
            self.signal_at = time.time()
        if self._phase == "running":
            if not first and self.group is not None:
                # A second signal cuts the grace period short, even while the main thread
                # is busy waiting for the workers to stop.
                for w in self.group.workers:
                    w.signal_group(signal.SIGKILL)
            self.events.put(("signal", signum if first else -signum))
        elif first:
            raise _Interrupted(signum)

    def _on_remote_event(self, topic: str, payload: dict[str, Any]) -> None:
        kind = {"rank_silent": "silent", "rank_heard": "heard", "rank_failed": "remote_failed",
                "node_lost": "node_lost", "job_stopping": "stop"}.get(topic)
        if kind is not None:
            self.events.put((kind, payload))

    # ------------------------------------------------------------------ setup / teardown

    def _start_watch(self) -> None:
        try:
            self.watch = Watch()
        except OSError as exc:
            self.console.event(f"cannot start the watcher ({exc.strerror or exc}): should this agent be "
                               "SIGKILLed, what its workers started would run on")

    def _start_fork_server(self) -> None:
        """Start the fork server now, so that it imports torch while the rendezvous runs."""
        if not self.cfg.fork_server:
            return
        if not is_subreaper():
            self.console.event("no fork server: this launcher cannot be the subreaper of its workers here "
                               "(PR_SET_CHILD_SUBREAPER); workers start as fresh interpreters")
            return
        env = node_env(self.environ, self.cfg.nproc_per_node, self.watch.mark if self.watch is not None else None)
        try:
            self.fork_server = ForkServer(self.python, env, self.console.event)
        except OSError as exc:
            self.console.event(f"no fork server ({exc.strerror or exc}): workers start as fresh interpreters")

    def _load_secret(self) -> tuple[bytes, str]:
        cfg = self.cfg
        try:
            if cfg.job_secret_file:
                source = f"--job-secret-file {cfg.job_secret_file}"
                return read_secret_file(cfg.job_secret_file, source="--job-secret-file"), source
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
        if self.watch is not None:
            self.watch.remove_at_death(str(self._run_dir))
        self.secret_file = str(write_secret_file(self._run_dir / "job.secret", secret))
        if cfg.log_dir:
            self.logs_root = Path(cfg.log_dir) / cfg.rdzv_id
            self.keep_logs = True
            try:
                self.logs_root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UsageError(f"--log-dir {cfg.log_dir!r}: cannot create {self.logs_root}: "
                                 f"{exc.strerror or exc}") from None
        elif any(cfg.redirects.values()) or any(cfg.tee.values()):
            self.logs_root = Path(tempfile.mkdtemp(prefix=f"torchcomms-run-logs-{cfg.rdzv_id}-"))
            self.keep_logs = True
            self.console.event(f"worker logs go to {self.logs_root}")
        else:
            self.logs_root = self._run_dir
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
            self.console.event(f"joining the rendezvous host at {endpoint} "
                               f"(join_timeout {cfg.rdzv_conf.join_timeout:g} s)")
            self.control = ControlPlane.join(
                address=f"tcp://{cfg.rdzv_host}:{cfg.rdzv_port}", secret=secret,
                timeout=cfg.rdzv_conf.join_timeout, secret_source=source,
                request_timeout=self.patience)
        if cfg.local_addr:
            self._addr = cfg.local_addr
        elif self.control.is_host:
            self._addr = cfg.rdzv_host
        else:
            self._addr = _route_addr(cfg.rdzv_host, cfg.rdzv_port)
        topics = ["rank_silent", "rank_heard"]  # the liveness of this node's ranks
        topics += ["rank_failed", "node_lost"] if self.control.is_host else ["job_stopping"]
        self.control.subscribe(topics, self._on_remote_event)

    def _teardown(self) -> None:
        if self.group is not None:
            self.group.kill_all()  # never waits again for a worker given up already
        for attempt, w in self.abandoned:
            self.console.event(
                f"exiting without reaping rank {w.result.rank} of attempt {attempt} (pid {w.pid}, "
                f"state {proc_state(w.pid) or 'unknown'}): SIGKILL is pending, so it ends when "
                f"the kernel lets it go, and its new parent (init) reaps it")
        if self.fork_server is not None:
            self.fork_server.close()
        if self.control is not None:
            self.control.close()  # (deregisters this node's heartbeats)
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        if self.watch is not None:
            self.watch.close()  # a normal exit: it kills nothing

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
        self._round = round_
        me = JoinRecord(agent_id=self.agent_id, host=self.hostname, addr=self._addr,
                        nproc=cfg.nproc_per_node, node_rank=cfg.node_rank,
                        master_port=_free_port())
        doing = f"joining rendezvous round {round_}"
        try:
            if self.control.is_host and round_ > 0:
                # every worker of the previous round has exited (or was given up): the new
                # group must not meet the old one's keys (stale rendezvous, agreement decisions)
                self.control.reset_worker_keys()
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

    def _run_round(self, plan: Plan) -> Decision:
        slot = plan.slot_of(self.agent_id)
        assert slot is not None and self.control is not None
        doing = f"starting the workers of round {plan.round}"
        for rank in range(slot.rank_offset, slot.rank_offset + slot.nproc):
            try:  # a predecessor's stale heartbeat member must not outlive it
                self.control.forget_member(f"rank/{rank}")
            except ControlUnavailableError as exc:
                if not self.control.is_host:  # gone since the plan: start no workers
                    raise lost(exc, self.control.address, doing) from None
            except ControlError:
                pass
        rnd = Round(self, plan, slot)
        loop: Decider | Follower
        if self.control.is_host:
            loop = Decider(self, rnd)
        else:
            loop = Follower(self, rnd)
            try:
                loop.start_heartbeats()
            except ControlError as exc:
                raise lost(exc, self.control.address, doing) from None
        self.group = rnd.group
        self._phase = "running"
        try:
            if self.signal_received is not None:  # a signal raced the start
                raise _Interrupted(self.signal_received)
            rnd.start()
            return loop.run()
        finally:
            self._phase = "idle"
            if isinstance(loop, Follower):
                loop.stop_heartbeats()
