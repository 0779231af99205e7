"""The decider: the rendezvous host's agent, which applies the failure policy to a round.

It hears of every failure once: its own workers' exits and liveness verdicts directly,
other nodes' failed ranks as ``rank_failed`` events, and lost nodes as the control server's
own ``node_lost`` event (every follower agent sends heartbeats as member ``node/<n>``).
When every node has reported (or is lost) it writes the round's decision and, at the job's
end, prints the summary.
"""

from __future__ import annotations

import json
import queue
import signal
import time
from typing import TYPE_CHECKING, Any

from torchcomms.control.errors import ControlError

from .exceptions import RendezvousError
from .rendezvous import KV, NodeSlot, Plan, rdzv_key
from .rounds import FAILURE_REASONS, Decision, Round, job_key
from .summary import describe_end, job_exit_code, render_root_cause, render_table, root_cause
from .supervisor import WorkerResult

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["Decider", "stop_between_rounds"]


class Decider:
    """Runs one round on the rendezvous host and returns its :class:`Decision`."""

    def __init__(self, agent: Agent, rnd: Round) -> None:
        self.agent = agent
        self.round = rnd
        self.cfg = agent.cfg
        self.console = agent.console
        self.kv = rnd.control.kv
        me = rnd.slot.node_rank
        self.remote = {n.node_rank: n for n in rnd.plan.nodes if n.node_rank != me}
        self.lost_at: dict[int, float] = {}  # node rank -> when it was last heard (epoch s)
        self.reported: set[int] = set()  # nodes whose results are in
        self.known_failed: set[int] = set()

    def run(self) -> Decision:
        rnd, cfg = self.round, self.cfg
        local_reported = False
        next_check = 0.0
        while True:
            try:
                kind, item = self.agent.events.get(timeout=cfg.monitor_interval)
            except queue.Empty:
                kind, item = "tick", None
            if kind == "signal":
                rnd.handle_signal(item)
                if item > 0:
                    self.broadcast_stop("exit", f"agent received {signal.Signals(item).name}",
                                        first=item)
            elif kind in ("silent", "heard"):
                rnd.on_liveness_event(kind, item)
            elif kind == "remote_failed":
                self._remote_failed(item)
            elif kind == "node_lost":
                self._node_lost(item)
            for what in rnd.check_liveness():
                self.apply_policy(what)
            for w in rnd.drain_exits():
                if w.result.failed and not rnd.stopping:
                    self.apply_policy(rnd.failure(w.result))
            now = time.monotonic()
            if now >= next_check:
                next_check = now + min(cfg.monitor_interval, cfg.rdzv_conf.heartbeat_interval)
                try:
                    for nr in self.remote:
                        if nr not in self.lost_at and nr not in self.reported \
                                and self.kv.check([job_key(rnd.number, "result", str(nr))]):
                            self.reported.add(nr)
                except ControlError as exc:
                    self.console.event(f"control plane error while monitoring: {exc}")
            if not local_reported and rnd.all_exits_seen():
                rnd.report_local()
                local_reported = True
            if local_reported and all(nr in self.reported or nr in self.lost_at
                                      for nr in self.remote):
                return self._finish()

    # ------------------------------------------------------------------ failures

    def _remote_failed(self, item: dict[str, Any]) -> None:
        rank = item.get("rank")
        if item.get("round") != self.round.number or item.get("node_rank") not in self.remote \
                or item.get("reason") not in FAILURE_REASONS or rank in self.known_failed:
            return
        self.known_failed.add(rank)
        if item.get("reason") == "unreapable":
            self.console.event(f"rank {rank} (pid {item.get('pid')}) on {item.get('host')} is "
                               f"unreapable (state {item.get('state') or 'unknown'})")
            self.apply_policy(f"rank {rank} is unreapable")
        elif item.get("reason") == "stopped":
            self.console.event(f"rank {rank} on {item.get('host')} is stopped")
            self.apply_policy(f"rank {rank} is stopped")
        else:
            self.console.event(f"rank {rank} on {item.get('host')} failed "
                               f"({_describe_event(item)})")
            self.apply_policy(f"rank {rank} failed")

    def _node_lost(self, item: dict[str, Any]) -> None:
        """The control server heard no heartbeat of a follower agent within its limit."""
        nr = item.get("node_rank")
        node: NodeSlot | None = self.remote.get(nr) if isinstance(nr, int) else None
        if node is None or nr in self.lost_at or nr in self.reported:
            return
        silent = item.get("silent_s")
        silent = float(silent) if isinstance(silent, (int, float)) else 0.0
        self.lost_at[node.node_rank] = time.time() - silent
        ranks = list(range(node.rank_offset, node.rank_offset + node.nproc))
        self.console.event(f"node {node.node_rank} ({node.host}, ranks {ranks[0]}-{ranks[-1]}) "
                           f"lost: no heartbeat for {silent:.1f} s")
        self.apply_policy(f"node {node.node_rank} lost")

    def broadcast_stop(self, action: str, reason: str, first: int = signal.SIGTERM) -> None:
        rnd = self.round
        if rnd.stop_action is not None:
            return
        rnd.stop_action, rnd.stop_reason = action, reason
        body = json.dumps({"action": action, "reason": reason}).encode()
        try:
            self.kv.set(job_key(rnd.number, "stop"), body)
            rnd.control.publish("job_stopping", {"reason": reason, "action": action,
                                                 "round": rnd.number})
        except ControlError:
            pass
        rnd.stop_local(first)

    def apply_policy(self, what: str) -> None:
        cfg, rnd = self.cfg, self.round
        if rnd.stop_action is not None:
            return
        if cfg.on_failure == "shrink":
            self.console.event(f"{what}; survivors keep running (--on-failure shrink)")
            return
        if cfg.on_failure == "restart" and rnd.number < cfg.max_restarts:
            self.console.event(f"{what}; restarting all workers "
                               f"(restart {rnd.number + 1} of {cfg.max_restarts})")
            self.broadcast_stop("restart", what)
        else:
            extra = " (no restarts left)" if cfg.on_failure == "restart" else ""
            self.console.event(f"{what}; stopping the job{extra}")
            self.broadcast_stop("exit", what)

    # ------------------------------------------------------------------ the round's end

    def _collect(self) -> list[WorkerResult]:
        rnd = self.round
        results: list[WorkerResult] = []
        for node in rnd.plan.nodes:
            if node.node_rank in self.lost_at:
                for lr in range(node.nproc):
                    results.append(WorkerResult(
                        rank=node.rank_offset + lr, local_rank=lr, node_rank=node.node_rank,
                        host=node.host, pid=None, started=rnd.started,
                        ended=self.lost_at[node.node_rank], lost=True))
                continue
            raw = self.kv.get(job_key(rnd.number, "result", str(node.node_rank)), timeout=30.0)
            results.extend(WorkerResult.from_dict(d) for d in json.loads(raw))
        return results

    def _finish(self) -> Decision:
        cfg, rnd = self.cfg, self.round
        results = self._collect()
        if rnd.stop_action == "restart":
            decision = Decision("restart", 0, rnd.stop_reason)
        else:
            code = job_exit_code(results, cfg.on_failure)
            if self.agent.signal_received is not None:
                code = 128 + abs(self.agent.signal_received)
            decision = Decision("exit", code, rnd.stop_reason or "all workers exited")
        self.kv.set(job_key(rnd.number, "decision"), decision.to_json())
        cause = root_cause(results)
        stopped_by = self._stopping_signal(cause)
        if stopped_by is not None:
            cause = None  # every failure came after the agent forwarded the signal
        if decision.action == "restart":
            if cause is not None:
                self.console.event(f"attempt {rnd.number} ended; root cause rank {cause.rank} "
                                   f"on {cause.host} ({describe_end(cause)})")
            return decision
        if cfg.summary and self.console.json_lines:
            self.console.event(
                "job finished", run_id=cfg.rdzv_id, exit_code=decision.exit_code,
                root_cause=None if cause is None else cause.to_dict(), signal=stopped_by,
                workers=[r.to_dict() for r in sorted(results, key=lambda r: r.rank)])
        elif cfg.summary:
            title = f"torchcomms-run: job {cfg.rdzv_id} finished with exit code {decision.exit_code}"
            text = render_table(results, title=title, mark_cause=stopped_by is None)
            if cause is not None:
                text += render_root_cause(cause)
            elif stopped_by is not None:
                text += f"root cause: torchcomms-run received {stopped_by} and stopped the workers\n"
            self.console.text(text)
        # Keep the store up until every live agent has read the decision.
        waiting = [nr for nr in self.remote if nr not in self.lost_at]
        deadline = time.monotonic() + max(5.0, 2 * cfg.rdzv_conf.heartbeat_timeout)
        while waiting and time.monotonic() < deadline:
            waiting = [nr for nr in waiting
                       if not self.kv.check([job_key(rnd.number, "ack", str(nr))])]
            if waiting:
                time.sleep(0.02)
        return decision


    def _stopping_signal(self, cause: WorkerResult | None) -> str | None:
        """The name of the signal that stopped the job when no worker failed before the agent
        received it (the workers' ends are then its doing, not their own failures)."""
        sig, at = self.agent.signal_received, self.agent.signal_at
        if sig is None or at is None or (cause is not None and cause.failure_time < at):
            return None
        try:
            return signal.Signals(abs(sig)).name
        except ValueError:
            return f"signal {abs(sig)}"


def _describe_event(payload: dict[str, Any]) -> str:
    sig = payload.get("signal")
    if isinstance(sig, int):
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"hung, {name}" if payload.get("reason") == "hung" else name
    return f"exit {payload.get('exit_code')}"


def stop_between_rounds(kv: KV, round_: int, host_agent: str, exit_code: int, reason: str,
                        wait_s: float) -> None:
    """The host stops outside a running round (a signal during a rendezvous, or before the workers
    of round ``round_`` started), and tells its followers so: those waiting for the round's plan
    get a plan that fails with ``exit_code``, those that have the plan its stop and an ``exit``
    decision. It waits at most ``wait_s`` for them to have read it (those with workers stop them
    first). Best effort: the host is leaving anyway."""
    deadline = time.monotonic() + wait_s
    try:
        if not kv.check([rdzv_key(round_, "plan")]):
            kv.set(rdzv_key(round_, "plan"), json.dumps({"failed": reason, "exit_code": exit_code}).encode())
            joined = int(kv.add(rdzv_key(round_, "count"), 0)) - 1  # but this agent
            while int(kv.add(rdzv_key(round_, "left"), 0)) < joined and time.monotonic() < deadline:
                time.sleep(0.02)
            return
        plan = Plan.from_json(kv.get(rdzv_key(round_, "plan"), timeout=0))
        kv.set(job_key(round_, "stop"), json.dumps({"action": "exit", "reason": reason}).encode())
        kv.set(job_key(round_, "decision"), Decision("exit", exit_code, reason).to_json())
        waiting = [n.node_rank for n in plan.nodes if n.agent_id != host_agent]
        while waiting and time.monotonic() < deadline:
            waiting = [nr for nr in waiting if not kv.check([job_key(round_, "ack", str(nr))])]
            time.sleep(0.02)
    except (ControlError, RendezvousError):
        pass
