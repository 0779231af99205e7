"""Groups made through ``torch.distributed`` on the route (TORCH_DISTRIBUTED_USE_TORCHCOMMS=1).

``new_group([0, 5])`` on two ranks: rank 0 (a member) raised CommValueError before the split
collective, while rank 1 (left out; torch's path for it calls ``comm.split([])``) waited in it
until the timeout, and the world communicator was broken (every later op: CommAbortedError).
c10d's gloo raises ValueError on every rank and carries on.

``new_group([0, 0])`` and ``split_group([[0], [1, 1]])``: torch refuses a list with a rank twice on
the ranks that read it (the members of a new group, the ranks whose group comes at or after it in
``split_ranks``) before any split, while the others took part in a split that nobody answered
(rank 1 of ``new_group([0, 0])`` waited in it and paired it with rank 0's next op; rank 0 of that
``split_group`` waited until the timeout)."""
from __future__ import annotations

from datetime import timedelta

import pytest

from tests.dist.route_runs import ROUTE, on_and_off
from tests.helpers.ranks import run_ranks
from tests.helpers.torch_versions import TORCH_2_13



@pytest.mark.parametrize("ranks", [[0, 5], [-1, 0]])
def test_a_member_list_with_a_rank_out_of_range_is_refused_and_the_world_goes_on(ranks: list[int]) -> None:
    results = run_ranks(2, "tests.dist.group_workers:bad_member_list", {"ranks": ranks}, timeout=120, env=ROUTE)
    r0, r1 = (res.value for res in results)
    if not TORCH_2_13:  # 2.11's new_group checks the ranks itself, on every rank, before any split
        assert r0["new_group"] == r1["new_group"] == "ValueError", (r0, r1)
    else:
        assert r0["new_group"] == "CommValueError" and "ValueError" in r0["mro"], r0
        assert r1["new_group"] == "non-member", r1
    assert r0["after"] == [2.0, 2.0] and r1["after"] == [2.0, 2.0]


def test_a_member_list_with_a_rank_twice_is_refused_on_every_rank_and_the_world_goes_on() -> None:
    results = run_ranks(2, "tests.dist.group_workers:bad_member_list",
                        {"ranks": [0, 0], "split_ranks": [[0], [1, 1]]}, timeout=120, env=ROUTE)
    for res in results:
        v = res.value
        if TORCH_2_13 or res.rank == 0:
            assert v["new_group"] in ("ValueError", "CommValueError") and "ValueError" in v["mro"], (res.rank, v)
        else:  # 2.11's new_group does not refuse the list: rank 1, not in it, is left out of the group
            assert v["new_group"] == "non-member", v
        if TORCH_2_13:  # 2.11's split_group wants a device bound to the default group
            assert "ValueError" in v["split_group"], (res.rank, v)
        assert v["after"] == [2.0, 2.0], (res.rank, v)


def test_a_group_c10ds_helper_makes_with_a_rank_twice_is_refused_before_its_rendezvous() -> None:
    """torch 2.11's ``new_group([0, 0])`` does not refuse the list and makes the group through
    c10d's process-group helper, whose arguments ``new_comm`` reads: rank 0 waited in the group's
    rendezvous for a second member until the timeout. (2.13 refuses the list before the helper, so
    the helper is stood in for here, by name and module, as ``new_comm`` finds it.)"""
    import torch.distributed as dist

    import torchcomms

    src = ("def _new_process_group_helper(group_size, group_rank, global_ranks_in_group, store):\n"
           "    return new_comm('gloo', 'cpu', name='twice', store=store, timeout=timedelta(seconds=5))\n")
    scope = {"__name__": "torch.distributed.distributed_c10d", "new_comm": torchcomms.new_comm,
             "timedelta": timedelta}
    exec(compile(src, "c10d_helper_stand_in", "exec"), scope)  # noqa: S102 - the test's own source
    with pytest.raises(torchcomms.CommValueError, match=r"ranks \[0, 0\]: it lists a rank twice"):
        scope["_new_process_group_helper"](2, 0, [0, 0], dist.HashStore())



@pytest.mark.parametrize("world", ["gloo", None])
def test_groups_naming_a_backend_same_as_c10d(world: str | None) -> None:
    # new_group(backend="gloo") on a gloo world raised c10d's RuntimeError ("... not present in
    # the parent process group: mps") on the members while the ranks left out waited in the split
    # until the timeout; new_group([0, 1], backend="cpu:gloo") left rank 2 in a second split (one
    # per device type of the world) that the members, splitting the cpu's only, never joined; a
    # world made without a backend could not be split with one at all; new_group([0, 1],
    # backend="nccl"), which torch refuses on the members before splitting, left rank 2 in a split
    # until the timeout, and the world communicator was broken; so did a timeout of 5 (not a
    # timedelta), which torch refuses on the members only
    on, off = on_and_off(3, "tests.dist.group_workers:groups_naming_a_backend", {"world": world}, timeout=120,
                         env=dict(ROUTE, TORCHCOMM_TIMEOUT_SECONDS="20"))
    for res in on + off:  # an error on the members (torch's split_group refusal, or no nccl); rank 2 goes on
        refused = res.value.pop("refused")
        assert refused == "non-member" if res.rank == 2 else isinstance(refused, list), (res.rank, refused)
        assert "TypeError" in res.value.pop("bad timeout"), res.rank  # on every rank, as c10d's gloo raises it
    sums = lambda v: {k: x[0] if isinstance(x, list) else x for k, x in v.items()}  # noqa: E731
    for a, b in zip(on, off):  # the route's groups are split from the world's: its device types only
        same = a.value == b.value if world else sums(a.value) == sums(b.value)
        assert same, (a.rank, a.value, b.value)
    devices = ["cpu", "cuda"] if world == "gloo" or not TORCH_2_13 else ["cpu"]  # 2.11's new_group does not split
    v = on[1].value
    assert v["all"] == [[6.0, 6.0], devices] and v["some"] == [[5.0, 5.0], devices], v
    assert v["cpu"] == [[3.0, 3.0], ["cpu"]] and on[2].value["cpu"] == "non-member" and v["after"] == 3.0, v
    # a backend that no device of the world uses: a group of its own over the store, as c10d makes it
    # (split_group, which torch 2.13's new_group delegates to there, raised ValueError on every member)
    assert v["fresh"] == [[3.0, 3.0], ["cpu"], [1.0, 1.0], [{"rank": 0}, {"rank": 1}], "glooalias"], v
    assert on[0].value["fresh"] == v["fresh"] and on[2].value["fresh"] == "non-member", on[0].value



def test_a_group_whose_devices_use_different_backends_gets_a_communicator_per_device() -> None:
    """``init_process_group("cpu:gloo,cuda:nccl")`` on the route: c10d's helper calls ``new_comm``
    once per backend under the group's name, and the second call raised CommValueError ("a
    communicator named '0' already exists in this process"). The helper is stood in for (as in
    the test above; the route's nccl needs a GPU): both communicators are gloo's on the CPU here."""
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    import torchcomms

    src = ("def _new_process_group_helper(backend_config, devices):\n"
           "    comms = []\n"
           "    for device in devices:\n"
           "        comms.append(new_comm('gloo', 'cpu', name='mixed', store=HashStore(),\n"
           "                              timeout=timedelta(seconds=5)))\n"
           "    return comms\n")
    scope = {"__name__": "torch.distributed.distributed_c10d", "new_comm": torchcomms.new_comm,
             "timedelta": timedelta, "HashStore": dist.HashStore}
    exec(compile(src, "c10d_helper_stand_in", "exec"), scope)  # noqa: S102 - the test's own source
    made = scope["_new_process_group_helper"]
    comms = made(BackendConfig(Backend("cpu:gloo,cuda:nccl")), ["cpu", "cuda"])
    comms += made(BackendConfig(Backend("gloo")), ["cpu"])  # one backend for every device: one communicator
    try:
        assert [c.get_name() for c in comms] == ["mixed:cpu", "mixed:cuda", "mixed"]
        t = torch.ones(2)
        comms[1].all_reduce(t, torchcomms.ReduceOp.SUM, async_op=False)
        assert t.tolist() == [1.0, 1.0]
    finally:
        for c in comms:
            c.finalize()


def test_the_ranks_left_out_of_a_group_c10ds_helper_makes_on_a_bound_world_split_nothing() -> None:
    """c10d's process-group helper calls ``perform_nocolor_split`` (ProcessGroupNCCL's) on the
    default group's backend on the ranks left out of a group it makes while the default group
    has a bound device (``init_process_group("nccl", device_id=...)``, then ``new_group(ranks,
    backend="gloo")``): the route's backend had no such method (AttributeError on those ranks).
    The route's members make a new communicator over the store, so there is nothing to join."""
    import torch

    import torchcomms
    from torchcomms._comms import _BackendWrapper

    comm = torchcomms.new_comm("fake", "cpu", "nocolor-split", hints={"rank": "0", "size": "1"})
    try:
        backend = _BackendWrapper(comm)
        assert backend.perform_nocolor_split(torch.device("cuda", 0)) is None
        t = torch.ones(2)
        comm.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=False)
        assert t.tolist() == [1.0, 1.0]
    finally:
        comm.finalize()


@pytest.mark.parametrize("devices,splits", [
    ({"cpu": "refused-cpu", "cuda": "refused-cuda"}, {"refused-cpu": 1, "refused-cuda": 1}),  # cpu:gloo,cuda:nccl
    ({"cpu": "refused-one", "cuda": "refused-one"}, {"refused-one": 2}),  # gloo: one communicator, two device types
])
def test_a_refused_member_list_takes_part_in_each_split_of_the_call_once(devices: dict[str, str],
                                                                        splits: dict[str, int]) -> None:
    """A member refusing ``new_group([0, 5])`` takes part as a non-member in each split the other
    ranks make: one per device type of the parent group, on that device type's communicator (the
    split loop of c10d's ``split_group``; 2.13's ``new_group`` on the ranks it leaves out). It split
    its own communicator once per device type of the world: on a ``"cpu:gloo,cuda:nccl"`` world
    twice (once too often) and the other device's not at all, so both fell out of step with the
    ranks left out. The parent is a c10d ``ProcessGroup`` holding the route's backends over fake
    communicators (a second engine on the CPU here), and ``split_group`` is stood in for, by name
    and module, as the forwarder finds it."""
    import json

    import torch
    import torch.distributed as dist

    import torchcomms
    from torchcomms._comms import _BackendWrapper
    from torchcomms._comms.forward import CommForwarder
    from torchcomms.hooks import FlightRecorderHook

    comms, recorders = {}, {}
    for name in dict.fromkeys(devices.values()):
        comms[name] = torchcomms.new_comm("fake", "cpu", name, hints={"rank": "0", "size": "2"})
        recorders[name] = FlightRecorderHook(max_entries=64)
        recorders[name].register_with_comm(comms[name])
    try:
        parent = dist.ProcessGroup(dist.HashStore(), 0, 2)
        wrappers = {name: _BackendWrapper(c) for name, c in comms.items()}
        types = {"cpu": dist.ProcessGroup.BackendType.GLOO, "cuda": dist.ProcessGroup.BackendType.CUSTOM}
        for device, name in devices.items():
            parent._register_backend(torch.device(device), types[device], wrappers[name])
        src = ("def split_group(parent_pg, device_types_filter, forwarder):\n"
               "    return forwarder.split([0, 5], 'refused', None)\n")
        scope: dict = {"__name__": "torch.distributed.distributed_c10d"}
        exec(compile(src, "c10d_split_group_stand_in", "exec"), scope)  # noqa: S102 - the test's own source
        first = parent._get_backend(parent._device_types[0]).get_comm()
        with pytest.raises(torchcomms.CommValueError, match=r"ranks \[5\] out of range"):
            scope["split_group"](parent, None, CommForwarder(first))
        made = {name: sum(e["profiling_name"] == "fake:split" and e["pg_id"] == name
                          for e in json.loads(r.dump_json())["entries"]) for name, r in recorders.items()}
        assert made == splits, made
    finally:
        for c in comms.values():
            c.finalize()
