"""Rank bodies: every c10d op through ``torch.distributed`` (route on or off), checked against
values computed locally."""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.int32, torch.int64, torch.uint8, torch.int8]


class Checker:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.unsupported: list[str] = []
        self.checks = 0

    def run(self, name: str, fn: Callable[[], tuple[Any, Any]]) -> None:
        if os.environ.get("TC_TRACE_OPS"):
            print("op", name, flush=True)
        try:
            got, want = fn()
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
            self.unsupported.append(f"{name}: {type(e).__name__}: {str(e)[:160]}")
            return
        self.checks += 1
        if isinstance(got, torch.Tensor):
            got, want = got.double().tolist(), want.double().tolist()
        if got != want:
            self.failures.append(f"{name}: got {str(got)[:200]} want {str(want)[:200]}")


def _val(rank: int, n: int, dtype: torch.dtype, k: int = 0) -> torch.Tensor:
    base = torch.arange(n, dtype=torch.float64) + 1 + rank + k
    if dtype.is_floating_point:
        return (base * 0.5).to(dtype)
    return (base % 7 + rank % 3).to(dtype)


def _reduce(ts: list[torch.Tensor], op: str) -> torch.Tensor:
    st = torch.stack([t.double() for t in ts]) if ts[0].is_floating_point() else torch.stack([t.long() for t in ts])
    if op == "sum":
        out = st.sum(0)
    elif op == "product":
        out = st.prod(0)
    elif op == "min":
        out = st.min(0).values
    elif op == "max":
        out = st.max(0).values
    elif op == "avg":
        out = st.sum(0) / len(ts) if ts[0].is_floating_point() else torch.div(st.sum(0), len(ts), rounding_mode="trunc")
    elif op == "band":
        out = ts[0].long()
        for t in ts[1:]:
            out = out & t.long()
    elif op == "bor":
        out = ts[0].long()
        for t in ts[1:]:
            out = out | t.long()
    elif op == "bxor":
        out = ts[0].long()
        for t in ts[1:]:
            out = out ^ t.long()
    return out.to(ts[0].dtype)


_OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG, "band": dist.ReduceOp.BAND,
        "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}


def every_op(device: str = "cpu") -> dict[str, Any]:
    """All c10d collectives and p2p ops on the default group (and one subgroup). ``device="cuda"``:
    ``init_process_group("nccl")`` on this rank's GPU, every tensor made there (the default
    device); point-to-point ops and subgroups need two ranks."""
    if device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
        torch.set_default_device(dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    recorder = None
    pg_backend = dist.group.WORLD._get_backend(dev)
    routed = hasattr(pg_backend, "get_comm")
    if routed:
        from torchcomms.hooks import FlightRecorderHook

        recorder = FlightRecorderHook(max_entries=4096)
        recorder.register_with_comm(pg_backend.get_comm())
    c = Checker()
    all_v = lambda dt, k=0: [_val(q, 5, dt, k) for q in range(n)]  # noqa: E731

    # all_reduce: every reduce op on every dtype family it is defined for
    for dt in FLOATS + INTS:
        ops = ["sum", "product", "min", "max", "avg"] + ([] if dt.is_floating_point else ["band", "bor", "bxor"])
        for op in ops:
            def f(dt=dt, op=op):
                t = _val(r, 5, dt)
                dist.all_reduce(t, op=_OPS[op])
                return t, _reduce(all_v(dt), op)
            c.run(f"all_reduce/{op}/{dt}", f)
    c.run("all_reduce/complex64", lambda: _complex_check(r, n))

    def premul():
        t = _val(r, 4, torch.float64)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        return t, _reduce(all_v(torch.float64), "sum")[:4] * 0.5
    c.run("all_reduce/premul_sum", premul)

    def reduce_(op: str, dt: torch.dtype):
        t = _val(r, 4, dt)
        dist.reduce(t, dst=n - 1, op=_OPS[op])
        if r != n - 1:  # a non-root buffer's content is unspecified after reduce (c10d's contract)
            return 1, 1
        return t, _reduce([_val(q, 4, dt) for q in range(n)], op)
    for dt in [torch.float32, torch.int64]:
        for op in ["sum", "max", "min", "product"]:
            c.run(f"reduce/{op}/{dt}", lambda op=op, dt=dt: reduce_(op, dt))

    def bcast(dt):
        t = _val(r, 6, dt)
        dist.broadcast(t, src=n - 1)
        return t, _val(n - 1, 6, dt)
    for dt in FLOATS + INTS + [torch.bool]:
        c.run(f"broadcast/{dt}", lambda dt=dt: bcast(dt))

    def all_gather(dt):
        outs = [torch.empty(3, dtype=dt) for _ in range(n)]
        dist.all_gather(outs, _val(r, 3, dt))
        return torch.cat(outs), torch.cat([_val(q, 3, dt) for q in range(n)])
    for dt in [torch.float32, torch.int32, torch.bfloat16]:
        c.run(f"all_gather/{dt}", lambda dt=dt: all_gather(dt))

    def all_gather_into_tensor():
        out = torch.empty(n * 4)
        dist.all_gather_into_tensor(out, _val(r, 4, torch.float32))
        return out, torch.cat([_val(q, 4, torch.float32) for q in range(n)])
    c.run("all_gather_into_tensor", all_gather_into_tensor)

    def all_gather_into_tensor_2d():
        out = torch.empty(n, 4)
        dist.all_gather_into_tensor(out, _val(r, 4, torch.float32))
        return out.flatten(), torch.cat([_val(q, 4, torch.float32) for q in range(n)])
    c.run("all_gather_into_tensor/stacked", all_gather_into_tensor_2d)

    def reduce_scatter(op):
        ins = [_val(r, 3, torch.float32, k) for k in range(n)]
        out = torch.empty(3)
        dist.reduce_scatter(out, ins, op=_OPS[op])
        return out, _reduce([_val(q, 3, torch.float32, r) for q in range(n)], op)
    for op in ["sum", "max", "avg"]:
        c.run(f"reduce_scatter/{op}", lambda op=op: reduce_scatter(op))

    def reduce_scatter_tensor(op):
        inp = torch.cat([_val(r, 3, torch.float64, k) for k in range(n)])
        out = torch.empty(3, dtype=torch.float64)
        dist.reduce_scatter_tensor(out, inp, op=_OPS[op])
        return out, _reduce([_val(q, 3, torch.float64, r) for q in range(n)], op)
    for op in ["sum", "min", "avg"]:
        c.run(f"reduce_scatter_tensor/{op}", lambda op=op: reduce_scatter_tensor(op))

    def a2a_single():
        inp = torch.arange(n * 2, dtype=torch.float32) + 100 * r
        out = torch.empty(n * 2)
        dist.all_to_all_single(out, inp)
        want = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * q for q in range(n)])
        return out, want
    c.run("all_to_all_single", a2a_single)

    def a2a_uneven():
        # rank q sends (q + p + 1) elements to rank p
        in_splits = [r + p + 1 for p in range(n)]
        out_splits = [q + r + 1 for q in range(n)]
        inp = torch.cat([torch.full((s,), float(100 * r + p)) for p, s in enumerate(in_splits)])
        out = torch.empty(sum(out_splits))
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        want = torch.cat([torch.full((s,), float(100 * q + r)) for q, s in enumerate(out_splits)])
        return out, want
    c.run("all_to_all_single/uneven", a2a_uneven)

    def a2a_list():
        ins = [torch.full((2,), float(10 * r + p)) for p in range(n)]
        outs = [torch.empty(2) for _ in range(n)]
        dist.all_to_all(outs, ins)
        return torch.cat(outs), torch.cat([torch.full((2,), float(10 * q + r)) for q in range(n)])
    c.run("all_to_all", a2a_list)

    def gather():
        lst = [torch.empty(3) for _ in range(n)] if r == 0 else None
        dist.gather(_val(r, 3, torch.float32), lst, dst=0)
        if r == 0:
            return torch.cat(lst), torch.cat([_val(q, 3, torch.float32) for q in range(n)])
        return torch.zeros(1), torch.zeros(1)
    c.run("gather", gather)

    def scatter():
        out = torch.empty(3)
        lst = [_val(q, 3, torch.float32, 9) for q in range(n)] if r == n - 1 else None
        dist.scatter(out, lst, src=n - 1)
        return out, _val(r, 3, torch.float32, 9)
    c.run("scatter", scatter)

    def send_recv():
        t = torch.full((4,), float(r))
        got = torch.empty(4)
        if r % 2 == 0:
            dist.send(t, (r + 1) % n)
            dist.recv(got, (r - 1) % n)
        else:
            dist.recv(got, (r - 1) % n)
            dist.send(t, (r + 1) % n)
        return got, torch.full((4,), float((r - 1) % n))
    if n % 2 == 0:
        c.run("send_recv/ring", send_recv)

    def isend_irecv():
        got = torch.empty(3)
        ws = [dist.isend(torch.full((3,), float(r)), (r + 1) % n), dist.irecv(got, (r - 1) % n)]
        for w in ws:
            w.wait()
        return got, torch.full((3,), float((r - 1) % n))
    if n > 1:
        c.run("isend_irecv", isend_irecv)

    def batch_p2p():
        got = torch.empty(5)
        ops = [dist.P2POp(dist.isend, torch.full((5,), float(r * 3)), (r + 1) % n),
               dist.P2POp(dist.irecv, got, (r - 1) % n)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return got, torch.full((5,), float(((r - 1) % n) * 3))
    if n > 1:
        c.run("batch_isend_irecv", batch_p2p)

    def coalesced_all_reduce():
        ts = [_val(r, 3, torch.float32, k) for k in range(3)]
        with dist._coalescing_manager(async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t)
        cm.wait()
        return torch.cat(ts), torch.cat([_reduce([_val(q, 3, torch.float32, k) for q in range(n)], "sum")
                                         for k in range(3)])
    c.run("coalesced/all_reduce", coalesced_all_reduce)

    def coalesced_all_gather():
        outs = [torch.empty(n * 2) for _ in range(2)]
        with dist._coalescing_manager(async_ops=True) as cm:
            for k, o in enumerate(outs):
                dist.all_gather_into_tensor(o, _val(r, 2, torch.float32, k))
        cm.wait()
        return torch.cat(outs), torch.cat([torch.cat([_val(q, 2, torch.float32, k) for q in range(n)])
                                           for k in range(2)])
    c.run("coalesced/all_gather_into_tensor", coalesced_all_gather)

    def coalesced_reduce_scatter():
        outs = [torch.empty(2) for _ in range(2)]
        with dist._coalescing_manager(async_ops=True) as cm:
            for k, o in enumerate(outs):
                dist.reduce_scatter_tensor(o, torch.cat([_val(r, 2, torch.float32, k + j) for j in range(n)]))
        cm.wait()
        want = [_reduce([_val(q, 2, torch.float32, k + r) for q in range(n)], "sum") for k in range(2)]
        return torch.cat(outs), torch.cat(want)
    c.run("coalesced/reduce_scatter_tensor", coalesced_reduce_scatter)

    def async_future():
        t = _val(r, 4, torch.float32)
        w = dist.all_reduce(t, async_op=True)
        fut = w.get_future()
        val = fut.wait()
        return val[0], _reduce([_val(q, 4, torch.float32) for q in range(n)], "sum")
    c.run("async/get_future", async_future)

    c.run("barrier", lambda: (dist.barrier(), (1, 1))[1])

    def objects():
        out = [None] * n
        dist.all_gather_object(out, {"rank": r, "s": "x" * r})
        lst = [f"from{n - 1}", n] if r == n - 1 else [None, None]
        dist.broadcast_object_list(lst, src=n - 1)
        return [out, lst], [[{"rank": q, "s": "x" * q} for q in range(n)], [f"from{n - 1}", n]]
    c.run("objects", objects)

    def subgroup():
        g = dist.new_group([0, 1])
        if r > 1:
            return 1, 1
        t = torch.full((2,), float(r + 1))
        dist.all_reduce(t, group=g)
        return t, torch.full((2,), 3.0)
    if n > 1:
        c.run("new_group/all_reduce", subgroup)

    def split():
        g = dist.split_group(split_ranks=[[q for q in range(n) if q % 2 == 0], [q for q in range(n) if q % 2 == 1]])
        t = torch.full((2,), float(r))
        dist.all_reduce(t, group=g)
        return t, torch.full((2,), float(sum(q for q in range(n) if q % 2 == r % 2)))
    if n > 1:
        c.run("split_group/all_reduce", split)

    ops: dict[str, int] = {}
    if recorder is not None:
        for e in json.loads(recorder.dump_json())["entries"]:
            ops[e["profiling_name"]] = ops.get(e["profiling_name"], 0) + 1
    dist.destroy_process_group()
    return {"failures": c.failures, "unsupported": c.unsupported, "checks": c.checks, "routed": routed,
            "backend": type(pg_backend).__name__, "recorded": ops}


def _complex_check(r: int, n: int) -> tuple[Any, Any]:
    t = torch.full((3,), complex(r, 1), dtype=torch.complex64)
    dist.all_reduce(t)
    return torch.view_as_real(t), torch.view_as_real(torch.full((3,), complex(sum(range(n)), n), dtype=torch.complex64))
