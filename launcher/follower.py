"""The follower: an agent on a node other than the rendezvous host.

It runs its workers, reports their failures and results, sends the control server this
node's heartbeats (member ``node/<node_rank>``: the server itself tells the decider when they
stop) and follows the decider's ``stop`` and ``decision`` keys.

A follower waits about ``heartbeat_timeout`` (``--rdzv-conf``) for any answer of the
rendezvous host, in every phase (each store call is bounded by it, and its waits are polls of
such calls): then it takes the host for lost, stops its workers and raises
:class:`~launcher.exceptions.ControlPlaneLostError` naming the host's address and what it was
doing. Once it has read the job's final ``exit`` decision, though, the job's end is known: a
host lost before the ack landed is only warned of, and the agent exits with the job's code.
A follower whose agent receives a signal leaves the job: it stops its workers, and each of
them that ends failed is published like any failure (the policy applies to it).
"""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING, NoReturn

from torchcomms.control.errors import ControlError

from .control_plane import lost
from .rounds import Decision, Round, job_key

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["Follower"]


class Follower:
    """Runs one round on a follower node and returns the decider's :class:`Decision`."""

    def __init__(self, agent: Agent, rnd: Round) -> None:
        self.agent = agent
        self.round = rnd
        self.cfg = agent.cfg
        self.console = agent.console
        self.control = rnd.control
        self.member = f"node/{rnd.slot.node_rank}"

    def start_heartbeats(self) -> None:
        """Become a member whose silence the server reports as ``node_lost`` (raises
        ``ControlError`` when the host does not answer the first beat)."""
        conf, slot = self.cfg.rdzv_conf, self.round.slot
        self.control.kv.heartbeat_start(
            self.member, conf.heartbeat_interval, limit=conf.heartbeat_timeout,
            info={"host": slot.host,
                  "ranks": list(range(slot.rank_offset, slot.rank_offset + slot.nproc))},
            timeout=self.agent.patience)

    def stop_heartbeats(self) -> None:
        try:
            self.control.kv.heartbeat_stop(self.member, timeout=self.agent.patience)
        except ControlError:
            pass  # a host that is gone forgets its members with it

    def run(self) -> Decision:
        rnd, kv = self.round, self.control.kv
        stop_key = job_key(rnd.number, "stop")
        decision_key = job_key(rnd.number, "decision")
        local_reported = False
        leaving: int | None = None
        doing = f"supervising the workers of round {rnd.number}"
        while True:
            try:
                kind, item = self.agent.events.get(timeout=self.cfg.monitor_interval)
            except queue.Empty:
                kind, item = "tick", None
            try:
                if kind == "signal":
                    rnd.handle_signal(item)
                    if item > 0:
                        leaving = item
                        rnd.leaving = not rnd.stopping  # not when the job is stopping anyway
                        rnd.stop_local(first=item)
                elif kind == "stop" and item.get("round") == rnd.number:
                    rnd.stop_local()
                elif kind in ("silent", "heard"):
                    rnd.on_liveness_event(kind, item)
                rnd.check_liveness()  # the decider hears of a stopped rank by its event
                rnd.drain_exits()
                if not rnd.stopping and kv.check([stop_key]):
                    rnd.stop_local()
                if not local_reported and rnd.all_exits_seen():
                    doing = f"publishing the results of round {rnd.number}"
                    rnd.report_local()
                    local_reported = True
                    if leaving is not None:
                        self._leave()
                        return Decision("exit", 128 + leaving, "signal")
                    doing = f"waiting for the decision of round {rnd.number}"
                if local_reported and kv.check([decision_key]):
                    decision = Decision.from_json(kv.get(decision_key, timeout=0))
                    doing = f"acknowledging the decision of round {rnd.number}"
                    self._acknowledge(decision)
                    if decision.action == "exit":
                        self.console.event(f"job finished with exit code {decision.exit_code} "
                                           f"(summary on the rendezvous host)")
                    return decision
            except ControlError as exc:  # the host stopped answering (each call is bounded)
                self.leave_lost_host(exc, doing)

    def _leave(self) -> None:
        """This node leaves on its own signal and waits for no decision: its ack tells the host not
        to wait for it either (a host that is gone needs no ack)."""
        try:
            self.control.kv.set(job_key(self.round.number, "ack", str(self.round.slot.node_rank)), b"1")
        except ControlError:
            pass

    def _acknowledge(self, decision: Decision) -> None:
        """Tell the host this agent read ``decision``. An ``exit`` decision is the job's end:
        a host lost before the ack landed is only warned of then (this agent exits with the
        job's code); a ``restart`` needs the host, so losing it raises ``ControlError``."""
        rnd = self.round
        if decision.action == "exit":
            self.control.close_subscriptions()
        self.stop_heartbeats()  # this node's part of the round is over: not a lost node
        try:
            self.control.kv.set(job_key(rnd.number, "ack", str(rnd.slot.node_rank)), b"1")
        except ControlError as exc:
            if decision.action != "exit":
                raise
            self.console.event(
                f"warning: lost the rendezvous host at {self.control.address} after the job's "
                f"decision (exit code {decision.exit_code}), before this agent's "
                f"acknowledgement landed: {exc}")

    def leave_lost_host(self, exc: BaseException, doing: str) -> NoReturn:
        """Stop the local workers and raise ``ControlPlaneLostError`` naming the host and
        what this agent was ``doing``."""
        rnd = self.round
        err = lost(exc, self.control.address, doing)
        if not rnd.stopping and rnd.group.alive():
            self.console.event(f"the rendezvous host at {self.control.address} stopped "
                               f"answering; stopping the workers "
                               f"(grace {self.cfg.grace_period:g} s)")
        rnd.stop_local()
        raise err from None
