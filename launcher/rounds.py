"""One round of a job on one node: the local workers, their exits and their liveness.

A :class:`Round` starts this node's workers for a rendezvous plan, reports each failure once
(a ``rank_failed`` event on the bus; the decider also reads the node's results), judges the
ranks' liveness (:mod:`launcher.liveness`) and stops them when asked. The decider
(:mod:`launcher.decider`) and follower (:mod:`launcher.follower`) loops drive it.

Store keys of round ``r`` (under ``torchcomms-run/job/<r>/``): ``stop`` (the decider asks
every agent to stop its workers; JSON ``{action, reason}``), ``result/<node_rank>`` (a node's
worker results, JSON list), ``decision`` (JSON ``{action: restart|exit, exit_code, reason}``)
and ``ack/<node_rank>``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchcomms.control.errors import ControlError

from .env import JobEndpoints, WorkerPlacement, mpi_worker_env, worker_env
from .errors import read_error_file
from .liveness import LivenessJudge, Verdict
from .output import STDERR, STDOUT, OutputPump, StreamRoute
from .rendezvous import KEY_ROOT, NodeSlot, Plan
from .summary import describe_end, stuck_hint
from .supervisor import Worker, WorkerGroup, WorkerResult, WorkerSpec

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["Decision", "Round", "job_key", "FAILURE_REASONS"]

#: ``rank_failed`` reasons an agent publishes for its own workers.
FAILURE_REASONS = ("exited", "killed", "unreapable", "hung", "stopped")
#: the ``rank_failed`` reason of a worker that exited 0 without a normal interpreter exit (its
#: heartbeat still registered: ``os._exit``): not a failure of the job, but its communicators'
#: peers must not wait for it (agreement, shrink). Not in FAILURE_REASONS: no policy applies.
LEFT_REASON = "left"


def job_key(round_: int, *parts: str) -> str:
    return "/".join((KEY_ROOT, "job", str(round_), *parts))


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


class Round:
    """This node's part of round ``plan.round``: its workers and what happened to them."""

    def __init__(self, agent: Agent, plan: Plan, slot: NodeSlot) -> None:
        assert agent.control is not None
        self.agent = agent
        self.cfg = agent.cfg
        self.console = agent.console
        self.control = agent.control
        self.plan = plan
        self.slot = slot
        self.number = plan.round
        self.started = time.time()
        self.stopping = False  # this node's workers are being stopped on purpose
        #: this node leaves the job on its own (its agent got a signal): the ranks it stops failed
        #: for the others, who hear of each as of any failure
        self.leaving = False
        self.stop_action: str | None = None  # the decider's stop broadcast, once sent
        self.stop_reason = ""
        self.exits_seen = 0
        #: pid of a process judged hung -> its SIGKILL deadline (after its dump window); per
        #: process, not per rank: a replacement in a hung rank's place is judged on its own
        self.hung: dict[int, float] = {}
        self.judge = LivenessJudge(hung_after=self.cfg.hung_timeout,
                                   stopped_after=self.cfg.stopped_timeout)
        server = agent.fork_server
        self.group = WorkerGroup(on_exit=self._on_worker_exit, watch=agent.watch,
                                 spawn=server.spawn if server is not None else None,
                                 spare=(server.pid,) if server is not None else ())
        self.restarts: dict[int, int] = {}  # rank -> processes started in its place

    # ------------------------------------------------------------------ start / stop

    def start(self) -> None:
        self.group.start(self._worker_specs())
        for w in self.group.workers:
            self.judge.watch(w.result.rank, w.pid)

    def _worker_specs(self) -> list[WorkerSpec]:
        return [self._worker_spec(lr) for lr in range(self.slot.nproc)]

    def _worker_spec(self, lr: int, restart: int = 0) -> WorkerSpec:
        """The spec of local rank ``lr``; ``restart`` > 0 for its replacements under
        ``--on-failure shrink`` (their own directory, error file and output pump)."""
        cfg, agent, plan, slot = self.cfg, self.agent, self.plan, self.slot
        assert agent.logs_root is not None and agent.secret_file is not None
        job = JobEndpoints(run_id=cfg.rdzv_id, master_addr=plan.master_addr,
                           master_port=plan.master_port, control_addr=self.control.address,
                           secret_file=agent.secret_file, restart_count=plan.round + restart,
                           max_restarts=cfg.max_restarts,
                           control_pid=os.getpid() if self.control.server is not None else None,
                           agent_mark=agent.watch.mark if agent.watch is not None else None)
        argv = cfg.worker_argv(agent.python)
        rank = slot.rank_offset + lr
        placement = WorkerPlacement(rank=rank, local_rank=lr, world_size=plan.world_size,
                                    local_world_size=slot.nproc, node_rank=slot.node_rank,
                                    num_nodes=len(plan.nodes), role=cfg.role)
        wdir = agent.logs_root / f"attempt_{plan.round}" / str(rank)
        if restart:
            wdir = wdir / f"restart_{restart}"
        wdir.mkdir(parents=True, exist_ok=True)
        error_file = wdir / "error.json"
        error_file.unlink(missing_ok=True)
        env = worker_env(agent.environ, placement, job, error_file=str(error_file))
        if cfg.backend == "mpi":
            mpi_worker_env(env)
        routes = {
            bit: StreamRoute(
                to_console=(cfg.local_ranks_filter is None or lr in cfg.local_ranks_filter)
                and not cfg.redirects.get(lr, 0) & bit,
                log_file=(wdir / ("stdout.log" if bit == STDOUT else "stderr.log"))
                if agent.keep_logs and (cfg.log_dir or (cfg.redirects.get(lr, 0)
                                                        | cfg.tee.get(lr, 0)) & bit)
                else None,
            )
            for bit in (STDOUT, STDERR)
        }
        prefix = cfg.line_prefix.format(host=agent.hostname, rank=rank, local_rank=lr,
                                        node_rank=slot.node_rank, role=cfg.role)
        meta = {"host": agent.hostname, "rank": rank, "local_rank": lr,
                "node_rank": slot.node_rank, "attempt": plan.round}
        return WorkerSpec(placement=placement, argv=argv, env=env, host=agent.hostname,
                          error_file=str(error_file), entry=cfg.worker_entry(),
                          output=OutputPump(self.console, prefix, meta, routes))

    def replace(self, w: Worker) -> bool:
        """Under ``--on-failure shrink`` with restarts left for its rank (``--max-restarts``
        each), start a new process in the place of the failed worker ``w`` while other
        workers of this node still run; the healthy ones are never restarted. Call from the
        agent's main thread."""
        rank = w.result.rank
        done = self.restarts.get(rank, 0)
        if (self.cfg.on_failure != "shrink" or self.stopping or done >= self.cfg.max_restarts
                or not any(x.alive for x in self.group.workers if x is not w)):
            return False
        self.restarts[rank] = done + 1
        spec = self._worker_spec(w.result.local_rank, restart=done + 1)
        new = self.group.start([spec])[-1]
        self.judge.watch(rank, new.pid)
        self.console.event(f"rank {rank} restarted (pid {new.pid}; restart {done + 1} of "
                           f"{self.cfg.max_restarts}, --on-failure shrink)")
        return True

    def stop_local(self, first: int = signal.SIGTERM) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.group.stop(self.cfg.grace_period, first=first)  # gives up the unkillable ones

    def handle_signal(self, signum: int) -> None:
        if signum < 0:  # a second signal: no more grace
            self.group.kill_all()
            return
        name = signal.Signals(signum).name
        self.console.event(f"received {name}: stopping the workers "
                           f"(grace {self.cfg.grace_period:g} s)")

    # ------------------------------------------------------------------ exits

    def _on_worker_exit(self, worker: Worker) -> None:
        """Runs on the worker's waiter thread, right after it exited, or on the thread that
        gave it up as unreapable (it is never called again for that worker)."""
        r = worker.result
        if r.unreapable:
            self.agent.abandoned.append((self.number, worker))
            self._log_unreapable(worker)
        registered = False
        try:  # its heartbeats (if any) stopped for a reason we already know
            registered = self.control.forget_member(f"rank/{r.rank}")
        except ControlError:
            pass
        if self.stopping and not self.leaving:
            return
        if not r.failed:
            # exited 0 without deregistering (os._exit, communicators open): the survivors that
            # shrink (the one policy under which they carry on) must not wait for it. Only then:
            # a job whose every rank ends by os._exit(0) would publish one event per rank.
            if registered and self.cfg.on_failure == "shrink":
                self._publish_failed({"rank": r.rank, "host": r.host, "node_rank": r.node_rank,
                                      "round": self.number, "reason": LEFT_REASON,
                                      "exit_code": r.exit_code, "signal": None})
            return
        reason = ("unreapable" if r.unreapable else "hung" if r.hung
                  else "killed" if r.signal is not None else "exited")
        payload: dict[str, Any] = {
            "rank": r.rank, "host": r.host, "node_rank": r.node_rank, "round": self.number,
            "reason": reason, "exit_code": r.exit_code, "signal": r.signal,
        }
        if r.unreapable:
            payload.update(pid=r.pid, state=r.state)
        self._publish_failed(payload)

    def _publish_failed(self, payload: dict[str, Any]) -> None:
        try:
            self.control.publish("rank_failed", payload)
        except ControlError:
            pass  # the decider also learns from this node's results

    def drain_exits(self) -> list[Worker]:
        """Exits not handled yet (each worker is returned exactly once)."""
        out = []
        while True:
            try:
                w = self.group.exits.get_nowait()
            except queue.Empty:
                return out
            self.exits_seen += 1
            self.judge.forget(w.result.rank)
            r = w.result
            if r.failed and not r.unreapable and not self.stopping:
                self.console.event(f"rank {r.rank} on {r.host} failed ({describe_end(r)})")
            out.append(w)
            if r.failed and not self.stopping:
                # what it started in its group must not run on beside the survivors (and a
                # replacement): the group of a reaped leader keeps its id while members live
                w.signal_group(signal.SIGKILL)
                self.replace(w)

    def all_exits_seen(self) -> bool:
        return self.exits_seen == len(self.group.workers)

    def _log_unreapable(self, w: Worker) -> None:
        r = w.result
        state = r.state or f"unknown (/proc/{r.pid}/stat unreadable)"
        self.console.event(
            f"rank {r.rank} (pid {r.pid}) on {r.host} is UNREAPABLE: not exited "
            f"{self.group.kill_wait:g} s after SIGKILL; process state {state}"
            f"{stuck_hint(state, ' - ')}. Giving it up as lost: nothing waits for it any longer",
            rank=r.rank, pid=r.pid, state=r.state)

    @staticmethod
    def failure(r: WorkerResult) -> str:
        return f"rank {r.rank} is unreapable" if r.unreapable else f"rank {r.rank} failed"

    def report_local(self) -> None:
        """Publish this node's results (the decider's account of every local worker)."""
        out = []
        for w in self.group.workers:
            r = w.result
            if r.failed and r.error_file:
                err = read_error_file(r.error_file)
                if err is not None:
                    r.error_message, r.error_traceback = err.message, err.traceback
            out.append(r.to_dict())
        self.control.kv.set(job_key(self.number, "result", str(self.slot.node_rank)),
                            json.dumps(out).encode())

    # ------------------------------------------------------------------ liveness

    def on_liveness_event(self, kind: str, payload: dict[str, Any]) -> None:
        """A ``rank_silent`` / ``rank_heard`` event of the control server."""
        rank, pid = payload.get("rank"), payload.get("pid")
        if not isinstance(rank, int) or not isinstance(pid, (int, type(None))):
            return
        if kind == "silent":
            silent = payload.get("silent_s")
            self.judge.silent(rank, float(silent) if isinstance(silent, (int, float)) else 0.0,
                              pid)
        else:
            self.judge.heard(rank, pid)

    def check_liveness(self) -> list[str]:
        """Judge the local ranks; act on new verdicts. Returns the failures that the job's
        policy must hear of now (a stopped rank; a hung one fails when it exits)."""
        if self.stopping:
            return []
        failures = []
        for v in self.judge.check():
            w = next((w for w in self.group.workers if w.result.rank == v.rank), None)
            if w is None or not w.alive:
                continue
            if v.kind == "hung":
                self._kill_hung(w, v)
            else:
                self._report_stopped(w, v)
                failures.append(f"rank {v.rank} is stopped")
        self._reap_hung()
        return failures

    def _kill_hung(self, w: Worker, v: Verdict) -> None:
        """Ask a hung rank for a flight-recorder dump (SIGUSR1) now and SIGKILL it when the
        dump window ends (see :meth:`_reap_hung`)."""
        self.console.event(
            f"rank {v.rank} on {w.result.host} is hung (no heartbeat for {v.silent_s:.1f} s, "
            f"no CPU progress for {v.quiet_s:.1f} s): asking for a flight-recorder dump "
            f"(SIGUSR1), then stopping it")
        w.request_dump(signal.SIGUSR1)
        w.result.hung = True
        self.hung[w.pid] = time.monotonic() + min(2.0, self.cfg.grace_period)

    def _report_stopped(self, w: Worker, v: Verdict) -> None:
        """A stopped rank is reported failed (reason ``stopped``) once, not killed: the
        survivors go on without it, and the policy decides what happens to it."""
        r = w.result
        r.failed_at = time.time()
        self.console.event(
            f"rank {v.rank} (pid {w.pid}) on {r.host} is stopped (process state T for "
            f"{v.quiet_s:.1f} s: SIGSTOP or a debugger): reported as failed, not killed")
        try:
            self.control.publish("rank_failed", {
                "rank": r.rank, "host": r.host, "node_rank": r.node_rank, "round": self.number,
                "reason": "stopped", "pid": w.pid})
        except ControlError:
            pass

    def _reap_hung(self) -> None:
        """SIGKILL hung ranks whose dump window ended; give up those that still have not
        exited ``kill_wait`` later (reported like an exit, see ``WorkerGroup.abandon``)."""
        now = time.monotonic()
        for w in self.group.workers:
            deadline = self.hung.get(w.pid) if w.result.hung else None
            if deadline is None or now < deadline or not w.alive:
                continue
            if now >= deadline + self.group.kill_wait:
                self.group.abandon(w)
            else:
                w.signal_group(signal.SIGKILL)
