"""``fsdp2.fully_shard``: torch's ``fully_shard`` with its collectives on torchcomms communicators."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, OffloadPolicy
from torch.distributed.fsdp import fully_shard as torch_fully_shard

from fsdp2.collectives import CommAllGather, CommReduceScatter, FSDPCommError, ReplicaAllReduce
from fsdp2.groups import FSDPComms, split_names

#: registry: the FSDPComms built for a parent communicator (by its name, unique per process)
#: and layout, so that every fully_shard call on one model shares one set of split communicators
_COMMS: dict[tuple[str, int, bool], FSDPComms] = {}


def fsdp_comms(comm: Any, *, replicate_size: int = 1, overlap: bool = True) -> FSDPComms:
    """The :class:`FSDPComms` for ``comm`` (split on first use; collective then)."""
    if isinstance(comm, FSDPComms):
        if replicate_size not in (1, comm.replicate_size):  # (1: the default, whatever comm's layout)
            raise FSDPCommError(f"replicate_size={replicate_size!r} differs from the given FSDPComms' "
                                f"{comm.replicate_size}: an FSDPComms carries its own layout")
        return comm
    if not hasattr(comm, "split") or not hasattr(comm, "get_name"):
        raise FSDPCommError(f"comm must be a torchcomms TorchComm or an FSDPComms, got {type(comm).__name__}")
    if not isinstance(overlap, bool):
        raise FSDPCommError(f"overlap must be a bool, got {overlap!r}")
    key = (comm.get_name(), replicate_size, overlap)
    got = _COMMS.get(key)
    if got is None or got.parent is not comm:
        wanted = split_names(key[0], replicate_size, overlap) if isinstance(replicate_size, int) else set()
        for (name, rep, ovl), other in _COMMS.items():
            taken = wanted & split_names(name, rep, ovl)
            if name == key[0] and other.parent is comm and taken:
                raise FSDPCommError(
                    f"communicator {name!r} already carries fsdp2's communicators for replicate_size={rep}, "
                    f"overlap={ovl} ({', '.join(sorted(taken))}), which replicate_size={replicate_size!r}, "
                    f"overlap={overlap!r} would split again; release_comms(fsdp2.comms_of(model)) first")
        got = _COMMS[key] = FSDPComms.build(comm, replicate_size=replicate_size, separate=overlap)
    return got


def release_comms(comms: FSDPComms, *, abort: bool = False) -> None:
    """Finalize (or, after a failure, abort) ``comms``' split communicators and forget them."""
    for k, v in list(_COMMS.items()):
        if v is comms:
            del _COMMS[k]
    if abort:
        comms.abort()
    else:
        comms.finalize()


def _own_params(module: nn.Module) -> list[torch.Tensor]:
    """The parameters this module's FSDP state manages (not those of nested FSDP modules)."""
    nested = {id(p) for m in module.modules() if m is not module and isinstance(m, FSDPModule)
              for p in m.parameters()}
    return [p for p in module.parameters() if id(p) not in nested]


def fully_shard(module: nn.Module, comm: Any, *, reshard_after_forward: bool | int | None = None,
                mp_policy: MixedPrecisionPolicy | None = None, offload_policy: OffloadPolicy | None = None,
                replicate_size: int = 1, overlap: bool = True, prefetch: int = 1,
                **torch_kwargs: Any) -> FSDPModule:
    """Shard ``module`` like ``torch.distributed.fsdp.fully_shard``, its collectives on torchcomms.

    ``comm``: a ``TorchComm`` over all ranks (the all-gather, reduce-scatter and HSDP all-reduce
    communicators are split from it once, on the first call) or an :class:`FSDPComms`.
    ``replicate_size > 1``: HSDP over a (replicate, shard) layout. ``overlap``: all-gather and
    reduce-scatter on separate communicators, with each reduce-scatter left in flight until the next
    one starts (default); ``False`` runs both on one communicator and waits for each reduction.
    ``prefetch``: when ``module`` contains modules sharded before it, each of them (in
    registration order, after ``module`` itself) all-gathers the next ``prefetch`` modules'
    parameters before its own forward computes (0: only FSDP's default backward prefetch).
    Other keywords go to torch's ``fully_shard`` (``mesh`` is set here).
    """
    if "mesh" in torch_kwargs:
        raise FSDPCommError("fsdp2.fully_shard builds the mesh from comm; pass an FSDPComms to choose it")
    if isinstance(module, FSDPModule):
        raise FSDPCommError(f"{type(module).__name__} is sharded already: fully_shard applies once per module")
    if not isinstance(prefetch, int) or prefetch < 0:
        raise FSDPCommError(f"prefetch must be a non-negative int, got {prefetch!r}")
    comms = fsdp_comms(comm, replicate_size=replicate_size, overlap=overlap)
    _check_post_forward(comms, reshard_after_forward)
    kwargs: dict[str, Any] = dict(torch_kwargs)
    if reshard_after_forward is not None:
        kwargs["reshard_after_forward"] = reshard_after_forward
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    if offload_policy is not None:
        kwargs["offload_policy"] = offload_policy
    out = torch_fully_shard(module, mesh=comms.mesh, **kwargs)
    _install(out, comms, overlap, _post_forward_comm(comms, reshard_after_forward))
    if prefetch:
        order = [out] + [m for m in module.modules() if m is not module and isinstance(m, FSDPModule)]
        for i, m in enumerate(order[:-1]):
            m.set_modules_to_forward_prefetch(order[i + 1:i + 1 + prefetch])
    return out


def _check_post_forward(comms: FSDPComms, reshard_after_forward: bool | int | None) -> None:
    """HSDP cannot reshard to a smaller group after forward: torch builds that group's mesh
    from the shard mesh it is given, whose ranks differ between shard groups, so the ranks'
    ``new_group`` calls disagree (they hung in ``fully_shard``)."""
    n = reshard_after_forward
    if comms.is_hsdp and isinstance(n, int) and not isinstance(n, bool) and 1 < n < comms.shard_size:
        raise FSDPCommError(
            f"reshard_after_forward={n} with replicate_size={comms.replicate_size}: HSDP reshards after forward "
            f"to the whole shard group ({comms.shard_size} ranks, True) or not at all (False), not to {n} ranks")


def _post_forward_comm(comms: FSDPComms, reshard_after_forward: bool | int | None) -> Any:
    """The all-gather communicator of the smaller group ``reshard_after_forward=n`` reshards to
    after forward (torch re-gathers over it in backward), or None when it is not an int between
    1 and the shard size (torch has validated the value by now)."""
    n = reshard_after_forward
    if isinstance(n, bool) or not isinstance(n, int) or not 1 < n < comms.shard_size:
        return None
    return comms.post_forward_comm(n)


def _install(module: FSDPModule, comms: FSDPComms, overlap: bool, post_forward: Any = None) -> None:
    module.set_custom_all_gather(CommAllGather(comms.all_gather, post_forward))
    rs = CommReduceScatter(comms.reduce_scatter, comms.reductions, lambda: _own_params(module), overlap)
    module.set_custom_reduce_scatter(rs)
    if comms.is_hsdp:
        module.set_all_reduce_hook(ReplicaAllReduce(comms.all_reduce, rs, comms.reductions,
                                                    lambda: gradient_divide_factor(module),
                                                    lambda: requires_all_reduce(module)))
    module._fsdp2_comms = comms  # type: ignore[attr-defined]
    module.register_forward_pre_hook(lambda *_: comms.reductions.new_pass())


def gradient_divide_factor(module: FSDPModule) -> float | None:
    """The factor set by ``module.set_gradient_divide_factor`` (torch keeps it on the module's
    parameter group and has no getter), or None."""
    group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
    return getattr(group, "gradient_divide_factor", None)


def requires_all_reduce(module: FSDPModule) -> bool:
    """What ``module.set_requires_all_reduce`` set (torch keeps it on the module's parameter
    group as ``all_reduce_grads``; default True)."""
    group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
    return bool(getattr(group, "all_reduce_grads", True))


def comms_of(module: nn.Module) -> FSDPComms:
    """The :class:`FSDPComms` ``module`` was sharded with."""
    got = getattr(module, "_fsdp2_comms", None)
    if got is None:
        raise FSDPCommError(f"{type(module).__name__} was not sharded by fsdp2.fully_shard")
    return got
