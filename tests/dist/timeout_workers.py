"""Rank bodies: the timeouts a program gives ``torch.distributed`` (``init_process_group``,
``new_group``) on our communicators."""
from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tests.dist.store_sync import done_through_the_store


def _comm_timeout_s(group: Any) -> float:
    return group._get_backend(torch.device("cpu")).get_comm().get_options().timeout.total_seconds()


def group_timeouts(init_s: float | None, group_s: float) -> dict[str, Any]:
    """The communicators' timeouts after ``init_process_group(timeout=init_s)`` (none given when
    ``None``), ``new_group(timeout=group_s)`` and ``new_group()``."""
    kw = {} if init_s is None else {"timeout": timedelta(seconds=init_s)}
    dist.init_process_group("gloo", **kw)
    given = dist.new_group([0, 1], timeout=timedelta(seconds=group_s))
    plain = dist.new_group([0, 1])
    out = {"world": _comm_timeout_s(dist.group.WORLD), "given": _comm_timeout_s(given),
           "plain": _comm_timeout_s(plain), "env": float(os.environ.get("TORCHCOMM_TIMEOUT_SECONDS", "nan"))}
    dist.destroy_process_group()
    return out


def peer_never_arrives(init_s: float) -> dict[str, Any]:
    """Rank 0 all-reduces; rank 1 never joins it and leaves once rank 0 is done (or after a
    minute). Rank 0's op must end at its own timeout (``CommTimeoutError``), not when rank 1
    leaves (``PeerFailureError``) nor after the communicator's default timeout."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=init_s))
    store = dist.distributed_c10d._get_default_store()
    out: dict[str, Any] = {}
    if dist.get_rank() == 0:
        try:
            dist.all_reduce(torch.ones(4))
            out["error"] = None
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["error"] = type(e).__name__
        store.set("tc-test/done", "1")
    else:
        try:
            store.wait(["tc-test/done"], timedelta(seconds=60))
        except Exception:  # noqa: BLE001 - rank 0 never got there: it is what the test reports
            pass
    dist.destroy_process_group()
    return out


def set_pg_timeout() -> dict[str, Any]:
    """c10d's ``_set_pg_timeout`` (what torchtitan calls after its first step) on the world and
    on a subgroup."""
    from torch.distributed.distributed_c10d import _set_pg_timeout

    dist.init_process_group("gloo")
    g = dist.new_group([0, 1])
    _set_pg_timeout(timedelta(seconds=5))
    _set_pg_timeout(timedelta(seconds=6), g)
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    out = {"world": _comm_timeout_s(dist.group.WORLD), "group": _comm_timeout_s(g), "sum": t.tolist()}
    dist.destroy_process_group()
    return out


def group_ops_time_out(group_s: float) -> dict[str, Any]:
    """Rank 0 runs ops on groups made with ``new_group(timeout=group_s)`` (one group per op: a
    timed-out op breaks its communicator) that rank 1 never joins; rank 1 leaves once rank 0 is
    done (rank 0, the store's host, leaves last). Each op's error type and message."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    store = dist.distributed_c10d._get_default_store()
    ops = {
        "recv": lambda g: dist.recv(torch.zeros(2), src=1, group=g),
        "all_gather_object": lambda g: dist.all_gather_object([None, None], {"k": 1}, group=g),
        "future": lambda g: dist.all_reduce(torch.ones(2), group=g, async_op=True).get_future().wait(),
    }
    groups = {name: dist.new_group([0, 1], timeout=timedelta(seconds=group_s)) for name in ops}
    out: dict[str, Any] = {}
    if dist.get_rank() == 0:
        for name, op in ops.items():
            try:
                op(groups[name])
                out[name] = "no error"
            except Exception as e:  # noqa: BLE001 - reported to the test
                out[name] = f"{type(e).__name__}: {e}"
    done_through_the_store(store, timedelta(seconds=300))
    return out


def _options(group: Any) -> dict[str, Any]:
    """What a program reads from ``group``'s c10d backend ``options``."""
    opts = group._get_backend(torch.device("cpu")).options
    return {"type": type(opts).__name__, "backend": opts.backend, "timeout": opts._timeout.total_seconds(),
            "own_name": opts.group_name == group.group_name, "ranks": list(opts.global_ranks_in_group),
            "threads": opts._threads, "devices": len(opts._devices)}


def backend_options() -> dict[str, Any]:
    """``backend.options`` of the world and of a subgroup, before and after ``_set_pg_timeout``."""
    from torch.distributed.distributed_c10d import _set_pg_timeout

    dist.init_process_group("gloo", timeout=timedelta(seconds=7))
    g = dist.new_group([0, 1], timeout=timedelta(seconds=4))
    out = {"world": _options(dist.group.WORLD), "group": _options(g)}
    _set_pg_timeout(timedelta(seconds=5))
    out["world_after"] = _options(dist.group.WORLD)
    dist.destroy_process_group()
    return out
