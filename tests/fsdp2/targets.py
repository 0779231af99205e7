"""Rank functions of the fsdp2 multi-process tests (run by tests.helpers.ranks)."""
from __future__ import annotations

import hashlib
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.fsdp import fully_shard as torch_fully_shard

import fsdp2
import torchcomms
from kernels.model import Llama, LlamaConfig

VOCAB = 512


def make_model(seed: int = 0, n_layers: int = 2) -> Llama:
    torch.manual_seed(seed)
    return Llama(LlamaConfig.tiny(loss_impl="torch", n_layers=n_layers))


def batches(rank: int, steps: int, batch: int = 2, seq: int = 32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + rank)
    return [torch.randint(0, VOCAB, (batch, seq + 1), generator=g) for _ in range(steps)]


def mp_policy(mp: bool) -> MixedPrecisionPolicy:
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mp else MixedPrecisionPolicy()


def train(model: torch.nn.Module, data: list[torch.Tensor], lr: float = 1e-2, sgd: bool = False) -> list[float]:
    # SGD where the gradients' scale must show in the parameters (AdamW all but cancels it)
    opt = (torch.optim.SGD(model.parameters(), lr=lr, foreach=True) if sgd
           else torch.optim.AdamW(model.parameters(), lr=lr, foreach=True))
    losses = []
    for tok in data:
        loss = model(tok[:, :-1], tok[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


def digest(params: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for n in sorted(params):
        h.update(n.encode())
        h.update(params[n].float().cpu().numpy().tobytes())
    return h.hexdigest()


def world_comm(name: str = "world", timeout_s: float = 60.0, device: str = "cpu") -> Any:
    """The world communicator: gloo on the CPU, nccl on this rank's GPU for ``device="cuda"``."""
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if device == "cuda" else torch.device("cpu")
    return torchcomms.new_comm("nccl" if device == "cuda" else "gloo", dev, name=name,
                               abort_process_on_timeout_or_error=False, timeout=timedelta(seconds=timeout_s))


def shard_ours(model: Llama, comm: Any, **kw: Any) -> Llama:
    for blk in model.blocks:
        fsdp2.fully_shard(blk, comm, **kw)
    fsdp2.fully_shard(model, comm, **kw)
    return model


def shard_stock(model: Llama, mesh: Any, **kw: Any) -> Llama:
    for blk in model.blocks:
        torch_fully_shard(blk, mesh=mesh, **kw)
    torch_fully_shard(model, mesh=mesh, **kw)
    return model


def numerics(steps: int = 20, replicate: int = 1, mp: bool = False, overlap: bool = True,
             reshard_after_forward: bool | int = True, device: str = "cpu") -> dict[str, Any]:
    """Train the tiny Llama with stock fully_shard (on the communicator's DeviceMesh) and with
    fsdp2 from the same initial weights and data; return both loss curves, max |Δ| of the
    final parameters and how many ops each of fsdp2's communicators ran. ``device="cuda"``: on
    this rank's GPU over nccl."""
    rank = int(os.environ["RANK"])
    comm = world_comm(device=device)
    dev = comm.get_device()
    raf = {"reshard_after_forward": reshard_after_forward}
    ours = shard_ours(make_model().to(dev), comm, mp_policy=mp_policy(mp), replicate_size=replicate, overlap=overlap,
                      **raf)
    comms = fsdp2.comms_of(ours)
    ran: dict[str, int] = {}
    for c in comms.communicators():
        c.register_pre_hook(lambda name, op_id, rec, c=c.get_name(): ran.__setitem__(c, ran.get(c, 0) + 1))
    data = [b.to(dev) for b in batches(rank, steps)]
    our_losses = train(ours, data)
    our_params = full_params(ours)
    stock = shard_stock(make_model().to(dev), comms.global_mesh, mp_policy=mp_policy(mp), **raf)
    stock_losses = train(stock, data)
    stock_params = full_params(stock)
    max_diff = max((our_params[n] - stock_params[n]).abs().max().item() for n in our_params)
    return {"ours": our_losses, "stock": stock_losses, "max_param_diff": max_diff, "ops": ran,
            "ours_digest": digest(our_params), "stock_digest": digest(stock_params)}


def sharded_twice() -> dict[str, Any]:
    """``fully_shard`` on a module sharded already: the error; the model still trains."""
    comm = world_comm()
    model = shard_ours(make_model(), comm)
    out: dict[str, Any] = {}
    try:
        fsdp2.fully_shard(model.blocks[0], comm)
    except Exception as e:  # noqa: BLE001 - the test inspects it
        out["error"] = [type(e).__name__, str(e)]
    out["steps"] = len(train(model, batches(int(os.environ["RANK"]), 1)))
    return out


def hsdp_post_forward_group() -> list[str]:
    """HSDP (2 x 4) with ``reshard_after_forward=2``: the error ``fully_shard`` raises."""
    comm = world_comm()
    got: list[str] = []
    try:
        fsdp2.fully_shard(torch.nn.Linear(8, 8), comm, replicate_size=2, reshard_after_forward=2)
    except Exception as e:  # noqa: BLE001 - the test inspects it
        got = [type(e).__name__, str(e)]
    comm.barrier(async_op=False)  # nobody exits (rank 0 hosts the store) while a peer still builds its mesh
    return got


def accumulate_without_all_reduce(steps: int = 3, micro: int = 3) -> dict[str, Any]:
    """HSDP gradient accumulation that reduce-scatters every microbatch but all-reduces across
    replicas only on the last (``set_requires_all_reduce``), ours and stock from the same
    weights and data: both loss curves, the final parameters and how many replica all-reduces
    fsdp2 ran."""
    rank = int(os.environ["RANK"])
    comm = world_comm()
    ours = shard_ours(make_model(), comm, replicate_size=2)
    comms = fsdp2.comms_of(ours)
    ran = [0]
    comms.all_reduce.register_pre_hook(lambda name, op_id, rec: ran.__setitem__(0, ran[0] + 1))
    stock = shard_stock(make_model(), comms.global_mesh)
    data = batches(rank, steps * micro)
    out: dict[str, Any] = {}
    for name, model in (("ours", ours), ("stock", stock)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
        losses = []
        for step in range(steps):
            for i, tok in enumerate(data[step * micro:(step + 1) * micro]):
                model.set_requires_all_reduce(i == micro - 1)
                loss = model(tok[:, :-1], tok[:, 1:])
                loss.backward()
                losses.append(loss.item())
            opt.step()
            opt.zero_grad(set_to_none=True)
        out[name] = losses
        out[f"{name}_digest"] = digest(full_params(model))
    out["all_reduces"] = ran[0]
    return out


def conflicting_layouts() -> dict[str, Any]:
    """One model sharded with the defaults, then models sharded on the same communicator with
    ``replicate_size=2`` (its all-gather and reduce-scatter communicators' names are taken:
    the error) and with ``overlap=False`` (other names: trains), then with ``replicate_size=2``
    again after ``release_comms`` of the first."""
    rank = int(os.environ["RANK"])
    comm = world_comm()
    first = shard_ours(make_model(), comm)
    out: dict[str, Any] = {}
    try:
        shard_ours(make_model(), comm, replicate_size=2)
    except Exception as e:  # noqa: BLE001 - the test inspects it
        out["replicate"] = [type(e).__name__, str(e)]
    out["no_overlap"] = len(train(shard_ours(make_model(), comm, overlap=False), batches(rank, 1)))
    fsdp2.release_comms(fsdp2.comms_of(first))
    out["after_release"] = len(train(shard_ours(make_model(), comm, replicate_size=2), batches(rank, 1)))
    return out


def fsdp_modules(model: torch.nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def divide_factor(steps: int = 6, factor: float = 3.0, replicate: int = 1) -> dict[str, Any]:
    """``set_gradient_divide_factor(factor)`` on every FSDP module, ours and stock, trained with
    SGD (so the gradients' scale shows): FSDP then reduce-scatters with PREMUL_SUM(1 / factor).
    On c10d's gloo (which refuses PREMUL_SUM) stock also needs ``set_force_sum_reduction_for_comms``
    (SUM, then divide by the factor); under TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 stock's PREMUL_SUM
    runs as issued."""
    rank = int(os.environ["RANK"])
    routed = os.environ.get("TORCH_DISTRIBUTED_USE_TORCHCOMMS") == "1"
    comm = world_comm()
    ours = shard_ours(make_model(), comm, replicate_size=replicate)
    issued: list[str] = []
    fsdp2.comms_of(ours).reduce_scatter.register_pre_hook(lambda name, op_id, rec: issued.append(rec.reduce_op))
    for m in fsdp_modules(ours):
        m.set_gradient_divide_factor(factor)
    data = batches(rank, steps)
    our_losses = train(ours, data, lr=0.5, sgd=True)
    our_params = full_params(ours)
    stock = shard_stock(make_model(), fsdp2.comms_of(ours).global_mesh)
    for m in fsdp_modules(stock):
        m.set_gradient_divide_factor(factor)
        if not routed:
            m.set_force_sum_reduction_for_comms(True)
    stock_losses = train(stock, data, lr=0.5, sgd=True)
    stock_params = full_params(stock)
    max_diff = max((our_params[n] - stock_params[n]).abs().max().item() for n in our_params)
    moved = max((our_params[n] - p).abs().max().item() for n, p in full_params(shard_stock(make_model(), fsdp2.comms_of(ours).global_mesh)).items())
    return {"ours": our_losses, "stock": stock_losses, "max_param_diff": max_diff, "moved": moved,
            "ops": sorted(set(issued)), "routed": routed,
            "ours_digest": digest(our_params), "stock_digest": digest(stock_params)}


def clipped(steps: int = 6, replicate: int = 1, max_norm: float = 0.05) -> dict[str, Any]:
    """``torch.nn.utils.clip_grad_norm_`` on the DTensor gradients before every step, ours and
    stock from the same weights and data: the total norms it returned and the results."""
    rank = int(os.environ["RANK"])
    comm = world_comm()
    ours = shard_ours(make_model(), comm, replicate_size=replicate)
    stock = shard_stock(make_model(), fsdp2.comms_of(ours).global_mesh)
    out: dict[str, Any] = {}
    for name, model in (("ours", ours), ("stock", stock)):
        opt = torch.optim.SGD(model.parameters(), lr=0.5, foreach=True)
        losses, norms = [], []
        for tok in batches(rank, steps):
            loss = model(tok[:, :-1], tok[:, 1:])
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            norms.append(norm.full_tensor().item() if hasattr(norm, "full_tensor") else norm.item())
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        params = full_params(model)
        out[name] = {"losses": losses, "norms": norms, "digest": digest(params)}
        out[f"{name}_params"] = params
    ours_p, stock_p = out.pop("ours_params"), out.pop("stock_params")
    out["max_param_diff"] = max((ours_p[n] - stock_p[n]).abs().max().item() for n in ours_p)
    return out


def flight_record(steps: int = 2) -> dict[str, Any]:
    """Train a few steps with a flight recorder on the parent communicator; return, per
    communicator name, the op names it ran (from the recorder's dump)."""
    import json

    from torchcomms.hooks import FlightRecorderHook

    rank = int(os.environ["RANK"])
    comm = world_comm()
    fr = FlightRecorderHook(max_entries=4096)
    fr.register_with_comm(comm)
    model = shard_ours(make_model(), comm)
    train(model, batches(rank, steps))
    dump = json.loads(fr.dump_json())
    names = {str(k): v["name"] for k, v in dump["pg_config"].items()}
    ops: dict[str, list[str]] = {}
    for e in dump["entries"]:
        pg = e["process_group"][0] if e.get("process_group") else names.get(str(e["pg_id"]), "?")
        ops.setdefault(pg, []).append(e["profiling_name"].split(":", 1)[-1])
    states = {e["state"] for e in dump["entries"]}
    return {"ops": ops, "states": sorted(states), "comm_names": [c.get_name() for c in fsdp2.comms_of(model).communicators()]}


def prefetch_order(prefetch: int = 1, n_layers: int = 4) -> list[int]:
    """How many all-gathers were issued when each block's forward started computing."""
    rank = int(os.environ["RANK"])
    comm = world_comm()
    model = make_model(n_layers=n_layers)
    for blk in model.blocks:
        fsdp2.fully_shard(blk, comm, prefetch=prefetch)
    fsdp2.fully_shard(model, comm, prefetch=prefetch)
    ag = fsdp2.comms_of(model).all_gather
    issued = [0]
    ag.register_pre_hook(lambda name, op_id, args: issued.__setitem__(0, issued[0] + 1))
    seen: list[int] = []
    for blk in model.blocks:
        blk.register_forward_pre_hook(lambda m, a: seen.append(issued[0]))
    tok = batches(rank, 1)[0]
    model(tok[:, :-1], tok[:, 1:]).backward()
    return seen


def killed_rank(victim: int = 2, step: int = 2, timeout_s: float = 30.0, phase: str = "forward",
                replicate: int = 1) -> dict[str, Any]:
    """The victim exits abruptly inside block 1's ``phase`` (forward/backward) of ``step``; survivors report the
    error they got (type, MRO, seconds from the victim's exit to the raise, and from the last op
    this rank issued on an FSDP communicator before it raised)."""
    import time

    rank = int(os.environ["RANK"])
    comm = world_comm(timeout_s=timeout_s)
    model = shard_ours(make_model(n_layers=3), comm, replicate_size=replicate)
    issued = [0.0]
    for c in fsdp2.comms_of(model).communicators():
        c.register_pre_hook(lambda name, op_id, rec: issued.__setitem__(0, time.time()))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = {"step": 0}
    mark = os.path.join(os.environ["TC_GROUP_DIR"], "victim_exit")

    def die(module: Any, *args: Any) -> None:
        if rank == victim and state["step"] == step:
            with open(mark, "w") as f:
                f.write(repr(time.time()))
            os._exit(17)

    if phase == "forward":
        model.blocks[1].register_forward_pre_hook(die)
    else:
        model.blocks[1].register_full_backward_pre_hook(die)
    data = batches(rank, step + 5)
    try:
        for i, tok in enumerate(data):
            state["step"] = i
            model(tok[:, :-1], tok[:, 1:]).backward()
            opt.step()
            opt.zero_grad()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        raised = time.time()
        with open(mark) as f:
            died = float(f.read())
        # what a user does next: keep the local shards, tear the FSDP communicators down
        shards = {k: v.to_local().clone() for k, v in model.state_dict().items()}
        fsdp2.release_comms(fsdp2.comms_of(model), abort=True)
        comm.abort()
        return {"teardown_s": time.time() - raised, "shards": len(shards), "type": type(e).__name__,
                "mro": [c.__name__ for c in type(e).__mro__], "message": str(e)[:400],
                "after_s": raised - died, "after_last_issue_s": raised - issued[0], "step": state["step"]}
    return {"type": None, "step": state["step"]}


def dcp_save(path: str, steps: int = 3) -> dict[str, Any]:
    """Train a few steps and save model + optimizer with torch.distributed.checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    rank = int(os.environ["RANK"])
    comm = world_comm()
    model = shard_ours(make_model(), comm)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for tok in batches(rank, steps):
        model(tok[:, :-1], tok[:, 1:]).backward()
        opt.step()
        opt.zero_grad()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    return {"digest": digest(full_params(model)), "world": dist.get_world_size()}


def dcp_load(path: str) -> dict[str, Any]:
    """Load what :func:`dcp_save` wrote onto this (different) world size; train one more step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    rank = int(os.environ["RANK"])
    comm = world_comm()
    model = shard_ours(make_model(seed=123), comm)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tok = batches(rank, 1)[0]
    model(tok[:, :-1], tok[:, 1:]).backward()  # materialise optimizer state to load into
    opt.step()
    opt.zero_grad()
    msd, osd = get_state_dict(model, opt)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    loaded = digest(full_params(model))
    losses = train(model, batches(rank, 2))
    return {"digest": loaded, "world": dist.get_world_size(), "losses": losses}



def c10d_ops_in_a_step(stock: bool = False) -> list[str]:
    """The c10d collectives (``c10d::*`` dispatcher ops, seen by the profiler) that one training
    step after the first runs: fsdp2's should be none; stock's are its all-gathers and
    reduce-scatters (the control)."""
    from torch.profiler import profile

    rank = int(os.environ["RANK"])
    comm = world_comm()
    model = shard_ours(make_model(), comm)
    if stock:
        model = shard_stock(make_model(), fsdp2.comms_of(model).mesh)
    data = batches(rank, 2)
    train(model, data[:1])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(data[1][:, :-1], data[1][:, 1:]).backward()
        opt.step()
    return sorted({e.name for e in prof.events() if e.name.startswith("c10d::")})


def step_memory(stock: bool, steps: int = 3, traced: int = 3, dim: int = 256, n_layers: int = 4,
                seq: int = 64) -> dict[str, Any]:
    """Train one model (fsdp2's or stock's, alone in this process) ``steps`` steps, then
    ``traced`` more, each under the allocation count (every thread's): the lowest of their peaks
    (a thread that frees late, on a loaded machine, only ever raises a step's peak), the first
    one's start and what the last one left allocated (``allocated_after``), in bytes above the
    count once the model was built."""
    import gc

    from benchmarks.alloc_peak import AllocationTrace, allocated_after, allocated_now, count_allocations

    count_allocations()
    rank = int(os.environ["RANK"])
    comm = world_comm()
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny(loss_impl="torch", dim=dim, n_layers=n_layers, ffn_dim=4 * dim))
    if stock:
        shard_stock(model, fsdp2.fsdp_comms(comm).mesh)
    else:
        shard_ours(model, comm)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    base = allocated_now()
    losses: list[float] = []
    peaks: list[int] = []
    start = end = 0
    for i, tok in enumerate(batches(rank, steps + traced, seq=seq)):
        if i >= steps:
            gc.collect()
            comm.barrier(async_op=False)
            trace = AllocationTrace()
            trace.__enter__()
        loss = model(tok[:, :-1], tok[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if i >= steps:
            trace.__exit__(None, None, None)
            peak = trace.peak()
            peaks.append(peak.peak - base)
            start = peak.start - base if i == steps else start
            end = allocated_after(peak) - base
    comm.barrier(async_op=False)
    return {"peak": min(peaks), "peaks": peaks, "start": start, "end": end, "losses": losses}
