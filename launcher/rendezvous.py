"""Rendezvous over the control-plane store: which nodes are in the job, and their ranks.

Round ``r`` (0 for the first attempt, one more per restart) uses keys under
``torchcomms-run/rdzv/<r>/``. Every agent takes an arrival number with ``add(count, 1)`` and
writes its join record under ``node/<n>``. The rendezvous host closes the round when
``max_nodes`` have joined, or ``last_call_timeout`` after ``min_nodes`` had joined, and then
writes the ``plan`` (nodes, node ranks, rank offsets, the MASTER_ADDR/PORT pair). If fewer
than ``min_nodes`` joined by ``join_timeout`` the host writes an error plan instead, so every
agent fails with the same message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from .exceptions import RendezvousClosedError, RendezvousError, RendezvousTimeoutError

__all__ = ["KV", "JoinRecord", "NodeSlot", "Plan", "join_round", "host_round", "rdzv_key", "KEY_ROOT"]

KEY_ROOT = "torchcomms-run"


class KV(Protocol):
    """The part of ``ControlClient`` the rendezvous uses."""

    def set(self, key: str, value: bytes) -> None: ...
    def get(self, key: str, timeout: float | None = None) -> bytes: ...
    def add(self, key: str, delta: int) -> int: ...
    def check(self, keys: list[str]) -> bool: ...


@dataclass(frozen=True)
class JoinRecord:
    """What an agent says about itself when it joins."""

    agent_id: str
    host: str
    addr: str
    nproc: int
    node_rank: int | None
    master_port: int


@dataclass(frozen=True)
class NodeSlot:
    """One admitted node in a plan."""

    agent_id: str
    host: str
    addr: str
    node_rank: int
    nproc: int
    rank_offset: int


@dataclass(frozen=True)
class Plan:
    """The outcome of a round: who is in the job and where its ranks are."""

    round: int
    world_size: int
    master_addr: str
    master_port: int
    nodes: tuple[NodeSlot, ...]

    def slot_of(self, agent_id: str) -> NodeSlot | None:
        return next((n for n in self.nodes if n.agent_id == agent_id), None)

    def to_json(self) -> bytes:
        data = asdict(self)
        return json.dumps(data).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Plan:
        data = json.loads(raw)
        if not isinstance(data, dict) or "nodes" not in data:
            raise RendezvousError(f"malformed rendezvous plan: {raw[:200]!r}")
        nodes = tuple(NodeSlot(**n) for n in data["nodes"])
        return cls(round=int(data["round"]), world_size=int(data["world_size"]),
                   master_addr=str(data["master_addr"]), master_port=int(data["master_port"]),
                   nodes=nodes)


def rdzv_key(round_: int, *parts: str) -> str:
    """The key ``parts`` of rendezvous round ``round_``."""
    return "/".join((KEY_ROOT, "rdzv", str(round_), *parts))



def join_round(kv: KV, round_: int, me: JoinRecord) -> int:
    """Announce this agent in round ``round_``; returns its arrival number (1-based)."""
    n = kv.add(rdzv_key(round_, "count"), 1)
    kv.set(rdzv_key(round_, "node", str(n)), json.dumps(asdict(me)).encode())
    return n


def wait_plan(kv: KV, round_: int, me: JoinRecord, timeout: float, poll: float = 0.05) -> Plan:
    """Wait for the host's plan of ``round_`` and find this agent in it.

    Polls with short calls rather than one long ``get``: each call is bounded by the client's
    timeout, so a host that stops answering is noticed then, not at ``timeout``."""
    key = rdzv_key(round_, "plan")
    deadline = time.monotonic() + timeout
    while not kv.check([key]):
        if time.monotonic() >= deadline:
            raise RendezvousError(
                f"the rendezvous host published no plan for round {round_} within {timeout:g} s")
        time.sleep(poll)
    raw = kv.get(key, timeout=0)
    data = json.loads(raw)
    if isinstance(data, dict) and "failed" in data:
        err = RendezvousError(str(data["failed"]))
        if isinstance(data.get("exit_code"), int):  # the host stopped the job (a signal)
            err.exit_code = data["exit_code"]
            kv.add(rdzv_key(round_, "left"), 1)  # read: the host need not wait for this agent
        raise err
    if isinstance(data, dict) and "error" in data:
        err = data["error"]
        raise RendezvousTimeoutError(err["endpoint"], err["joined"], int(err["missing"]),
                                     float(err["timeout"]))
    plan = Plan.from_json(raw)
    if plan.slot_of(me.agent_id) is None:
        raise RendezvousClosedError(
            f"rendezvous round {round_} closed with {len(plan.nodes)} node(s) before this "
            f"agent ({me.host}) was admitted; the job runs without it"
        )
    return plan


def _assign(records: list[JoinRecord], round_: int) -> Plan:
    wanted = [r.node_rank for r in records if r.node_rank is not None]
    dup = sorted({r for r in wanted if wanted.count(r) > 1})
    if dup:
        raise RendezvousError(f"several nodes asked for --node-rank {dup[0]}")
    bad = [r for r in wanted if r >= len(records)]
    if bad:
        raise RendezvousError(
            f"--node-rank {bad[0]} is out of range: only {len(records)} node(s) joined")
    free = iter(r for r in range(len(records)) if r not in set(wanted))
    ranked = sorted(((r.node_rank if r.node_rank is not None else next(free)), r)
                    for r in records)
    slots, offset = [], 0
    for node_rank, rec in ranked:
        slots.append(NodeSlot(agent_id=rec.agent_id, host=rec.host, addr=rec.addr,
                              node_rank=node_rank, nproc=rec.nproc, rank_offset=offset))
        offset += rec.nproc
    first = ranked[0][1]
    return Plan(round=round_, world_size=offset, master_addr=first.addr,
                master_port=first.master_port, nodes=tuple(slots))


def host_round(kv: KV, round_: int, *, min_nodes: int, max_nodes: int, join_timeout: float,
               last_call_timeout: float, endpoint: str, poll: float = 0.02,
               should_abort: Callable[[], bool] | None = None) -> Plan:
    """Run round ``round_`` as the rendezvous host: wait for nodes, then publish the plan."""
    start = time.monotonic()
    min_reached_at: float | None = None
    count_key = rdzv_key(round_, "count")
    while True:
        count = int(kv.add(count_key, 0))
        now = time.monotonic()
        if count >= max_nodes:
            break
        if count >= min_nodes:
            if min_reached_at is None:
                min_reached_at = now
            if now - min_reached_at >= last_call_timeout:
                break
        elif now - start >= join_timeout:
            joined = [_record(kv, round_, i).host for i in range(1, count + 1)]
            err = {"endpoint": endpoint, "joined": joined, "missing": min_nodes - count,
                   "timeout": join_timeout}
            kv.set(rdzv_key(round_, "plan"), json.dumps({"error": err}).encode())
            raise RendezvousTimeoutError(endpoint, joined, min_nodes - count, join_timeout)
        if should_abort is not None and should_abort():
            raise RendezvousError("rendezvous interrupted")
        time.sleep(poll)
    admitted = min(count, max_nodes)
    records = [_record(kv, round_, i) for i in range(1, admitted + 1)]
    try:
        plan = _assign(records, round_)
    except RendezvousError as exc:
        kv.set(rdzv_key(round_, "plan"), json.dumps({"failed": str(exc)}).encode())
        raise
    kv.set(rdzv_key(round_, "plan"), plan.to_json())
    return plan


def _record(kv: KV, round_: int, n: int) -> JoinRecord:
    raw = kv.get(rdzv_key(round_, "node", str(n)), timeout=30.0)
    data: dict[str, Any] = json.loads(raw)
    return JoinRecord(**data)
