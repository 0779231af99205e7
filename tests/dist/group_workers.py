"""Rank bodies: making ``torch.distributed`` groups on our communicators."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def bad_member_list(ranks: list[int], split_ranks: list[list[int]] | None = None) -> dict[str, Any]:
    """``new_group(ranks)`` with a rank out of range or listed twice, then ``split_group(split_ranks)``
    (when given), then the world and a good subgroup."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    out: dict[str, Any] = {}
    try:
        g = dist.new_group(ranks)
        out["new_group"] = "non-member" if g == dist.GroupMember.NON_GROUP_MEMBER else "member"
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["new_group"] = type(e).__name__
        out["mro"] = [c.__name__ for c in type(e).__mro__]
    if split_ranks is not None:
        try:
            out["split_group"] = "none" if dist.split_group(split_ranks=split_ranks) is None else "group"
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["split_group"] = [c.__name__ for c in type(e).__mro__]
    t = torch.ones(1)
    dist.all_reduce(t)
    g = dist.new_group([0, 1])
    u = torch.ones(1)
    dist.all_reduce(u, group=g)
    out["after"] = [t.item(), u.item()]
    dist.destroy_process_group()
    return out


#: a second name of the gloo engine (torchcomms' GlooBackend, c10d's ProcessGroupGloo): a backend
#: that no device of a gloo world uses and that both can build on the CPU, as gloo beside an nccl world
ALIAS = "glooalias"


def _register_alias() -> None:
    import torchcomms
    from torchcomms.backends.gloo import GlooBackend

    torchcomms.register_backend(ALIAS, GlooBackend)
    dist.Backend.register_backend(ALIAS, lambda store, rank, size, timeout: dist.ProcessGroupGloo(
        store, rank, size, timeout), devices=["cpu"])


def groups_naming_a_backend(world: str | None) -> dict[str, Any]:
    """``new_group`` with a ``backend`` (the world's, or one device's) for all ranks and for some,
    on a world made with backend ``world``: each group's all-reduce and device types, or the
    rank's ``"non-member"``; a group of ranks 0 and 1 with a backend the world's devices do not use
    (:data:`ALIAS`): its all-reduce, broadcast, all-gather of objects, device types and backend;
    then a group with a backend the world does not use and this machine lacks (``"nccl"``)."""
    _register_alias()
    dist.init_process_group(world, timeout=timedelta(seconds=20))
    out: dict[str, Any] = {}
    rank = dist.get_rank()
    for label, ranks, backend in (("all", None, "gloo"), ("some", [1, 2], "gloo"), ("cpu", [0, 1], "cpu:gloo"),
                                  ("fresh", [0, 1], ALIAS)):
        g = dist.new_group(ranks, backend=backend)
        if g == dist.GroupMember.NON_GROUP_MEMBER:
            out[label] = "non-member"
            continue
        t = torch.full((2,), float(rank + 1))
        dist.all_reduce(t, group=g)
        out[label] = [t.tolist(), sorted(str(d) for d in g._device_types)]
        if label == "fresh":
            b, objs = torch.full((2,), float(rank)), [None, None]
            dist.broadcast(b, group_src=1, group=g)
            dist.all_gather_object(objs, {"rank": rank}, group=g)
            out[label] += [b.tolist(), objs, dist.get_backend(g)]
    # refused on the members: a backend this machine lacks (nccl without CUDA), a timeout not a timedelta
    for label, kwargs in (("refused", {"backend": "nccl"}), ("bad timeout", {"timeout": 5})):
        try:
            g = dist.new_group([0, 1], **kwargs)
            out[label] = "non-member" if g == dist.GroupMember.NON_GROUP_MEMBER else "member"
        except (RuntimeError, ValueError, TypeError) as e:
            out[label] = [c.__name__ for c in type(e).__mro__]
    t = torch.ones(1)
    dist.all_reduce(t)
    out["after"] = t.item()
    dist.destroy_process_group()
    return out


def gloo_groups_beside_nccl(bound: bool) -> dict[str, Any]:
    """``init_process_group("nccl")`` (with ``device_id``, the rank's GPU, where ``bound``), then
    ``new_group(backend="gloo")`` of every rank: its CPU all-reduce, broadcast from the last rank,
    all-gather of objects, backend and whether the route made it; then ``new_group([0],
    backend="gloo")`` (rank 0's membership) and an all-reduce of the world on the GPU."""
    import os

    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev if bound else None, timeout=timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    g = dist.new_group(backend="gloo")
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t, group=g)
    b = torch.full((2,), float(rank))
    dist.broadcast(b, group_src=size - 1, group=g)
    objs: list[Any] = [None] * size
    dist.all_gather_object(objs, {"rank": rank}, group=g)
    out: dict[str, Any] = {"all_reduce": t.tolist(), "broadcast": b.tolist(), "objects": objs,
                           "backend": dist.get_backend(g),
                           "routed": type(g._get_backend(torch.device("cpu"))).__name__ == "_BackendWrapper"}
    only0 = dist.new_group([0], backend="gloo")  # ranks 1.. are left out (a bound world: c10d's "nocolor split")
    out["only_0"] = only0 != dist.GroupMember.NON_GROUP_MEMBER
    if out["only_0"]:
        x = torch.full((1,), 7.0)
        dist.all_reduce(x, group=only0)
        out["only_0_sum"] = x.item()
    w = torch.ones(2, device=dev)
    dist.all_reduce(w)
    out["world"] = w.tolist()
    dist.destroy_process_group()
    return out
